"""`pycni svc trace`: what a node's Service table does with one packet, from the store.

The model is the proxy's own (``services.proxy.view.calc_model`` over the same prefixes pycnid
watches, with the node's own addresses and proxy settings), so the answer is what that node
programs, not a second reading of the records. The caller passes ``local`` and ``config`` for
the node it runs on (the CLI runs in the node's netns, as pycnid does, and reads
``services.proxy.inputs.read_local_addresses`` and its pycnid config); another node's are what
its proxy published after its last pass (``ProxyInputs``); a node whose proxy never published
is known by its node record only (NodePorts on the record's address, default settings). The
answer says which inputs it used.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from cni.spec.errors import InvalidConfig
from services.proxy.config import DEFAULT_PROXY_CONFIG, ProxyConfig, render_proxy_settings
from services.proxy.inputs import ProxyInputs
from services.proxy.model import PROTOCOLS, IPAddress
from services.proxy.trace import explain, render_answer
from services.proxy.view import PREFIXES, Records, calc_model
from store.base import Store
from store.keys import proxy_inputs_key


def parse_endpoint(text: str, option: str, need_port: bool) -> tuple[IPAddress, int]:
    """``IP``, ``IP:PORT``, ``[IPv6]:PORT`` or a bare IPv6 address (port 0: any)."""
    host, port = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    try:
        ip = ipaddress.ip_address(host)
        number = int(port) if port else 0
    except ValueError:
        why = (
            "a port is a number (a Service port's name is not traced)"
            if port and not port.isdigit()
            else "IP[:PORT] is expected"
        )
        raise InvalidConfig(f"invalid {option} {text!r}: {why}") from None
    if not 0 <= number < 65536 or (need_port and not number):
        raise InvalidConfig(f"invalid {option} {text!r}: a port 1-65535 is expected")
    return ip, number


def parse_target(text: str) -> tuple[IPAddress, int, str]:
    """``VIP:PORT/PROTO`` (the protocol defaults to tcp)."""
    address, _, proto = text.partition("/")
    proto = (proto or "tcp").lower()
    if proto not in PROTOCOLS:
        raise InvalidConfig(
            f"invalid --to {text!r}: the protocol is one of {', '.join(PROTOCOLS)}"
        )
    ip, port = parse_endpoint(address, "--to", need_port=True)
    return ip, port, proto


def read_records(store: Store) -> Records:
    records = Records()
    for prefix in PREFIXES:
        records.replace_all(store.range(prefix), prefix)
    return records


def trace(
    store: Store,
    node: str,
    source: str,
    target: str,
    local: Iterable[str] | None = None,
    config: ProxyConfig | None = None,
    iif: str | None = None,
    records: Records | None = None,
) -> dict[str, Any]:
    """The answer of ``node``'s table for a packet from ``source`` to ``target`` (in on
    ``iif`` when given); ``local`` and ``config``: the node's own addresses and its proxy's
    settings when the caller runs on it, else None (read what ``node`` published);
    ``records``: the proxy's inputs when not the store's (``services/ops/kube.py``)."""
    src_ip, src_port = parse_endpoint(source, "--from", need_port=False)
    dst_ip, dst_port, proto = parse_target(target)
    if src_ip.version != dst_ip.version:
        raise InvalidConfig("invalid --from: not the family of --to")
    records = records if records is not None else read_records(store)
    if node not in records.nodes:
        raise InvalidConfig(
            f"invalid --node {node!r}: no node record of that name",
            "pycni node ls lists the nodes",
        )
    addresses, settings, inputs = read_inputs(store, node, local, config)
    model = calc_model(records, node, dst_ip.version, addresses, settings)
    answer = explain(model, model.node, src_ip, src_port, dst_ip, dst_port, proto, iif)
    host = f"[{dst_ip}]" if dst_ip.version == 6 else str(dst_ip)
    return {
        "node": node,
        "from": source,
        "to": f"{host}:{dst_port}/{proto}",
        "iif": iif,
        "nodeIPs": [str(ip) for ip in model.node.node_ips],
        "inputs": inputs,
        "answer": answer.to_dict(),
        "text": render_answer(answer),
    }


def read_inputs(
    store: Store, node: str, local: Iterable[str] | None, config: ProxyConfig | None
) -> tuple[tuple[str, ...], ProxyConfig, dict[str, Any]]:
    """(addresses, settings, where they came from) of ``node``'s proxy."""
    if local is not None:
        settings = config or DEFAULT_PROXY_CONFIG
        return (
            tuple(local),
            settings,
            {"source": "local", "settings": render_proxy_settings(settings)},
        )
    kv = store.get(proxy_inputs_key(node))
    if kv is None:
        return (), DEFAULT_PROXY_CONFIG, {"source": "node-record", "settings": {}}
    published = ProxyInputs.from_bytes(kv.key, kv.value)
    doc = {
        "source": "published",
        "at": published.at,
        "settings": render_proxy_settings(published.config),
    }
    return published.addresses, published.config, doc


INPUT_TEXT = {
    "local": "this node's addresses and pycnid config",
    "published": "the addresses and settings its proxy published",
    "node-record": "its node record's address and default settings (its proxy published none)",
}


def render_trace(doc: dict) -> str:
    iif = f" in on {doc['iif']}" if doc.get("iif") else ""
    inputs = f"  (from {INPUT_TEXT[doc['inputs']['source']]})"
    return f"on {doc['node']}, {doc['from']} -> {doc['to']}{iif}{inputs}\n{doc['text']}"
