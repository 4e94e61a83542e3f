"""`pycni svc trace`: what a node's Service table does with one packet, from the store.

The model is the proxy's own (``services.proxy.view.calc_model`` over the same prefixes pycnid
watches, with the node's own addresses as ``services.proxy.inputs.read_local_addresses`` reads
them for the proxy), so the answer is what that node programs, not a second reading of the
records. The caller passes ``local`` for the node it runs on (the CLI runs in the node's netns,
as pycnid does); a node other than the one asking is known by its node record only: its
NodePorts are traced on the record's address (the proxy on that node also answers on its other
global addresses), and the answer lists the NodePort addresses it used.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from cni.spec.errors import InvalidConfig
from services.proxy.config import DEFAULT_PROXY_CONFIG, ProxyConfig
from services.proxy.model import PROTOCOLS, IPAddress
from services.proxy.trace import explain, render_answer
from services.proxy.view import PREFIXES, Records, calc_model
from store.base import Store


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
    local: Iterable[str] = (),
    config: ProxyConfig = DEFAULT_PROXY_CONFIG,
) -> dict[str, Any]:
    """The answer of ``node``'s table for a packet from ``source`` to ``target``; ``local``
    and ``config``: the node's own addresses and its proxy's settings when the caller runs on
    it (what its proxy reads)."""
    src_ip, src_port = parse_endpoint(source, "--from", need_port=False)
    dst_ip, dst_port, proto = parse_target(target)
    if src_ip.version != dst_ip.version:
        raise InvalidConfig("invalid --from: not the family of --to")
    records = read_records(store)
    if node not in records.nodes:
        raise InvalidConfig(
            f"invalid --node {node!r}: no node record of that name",
            "pycni node ls lists the nodes",
        )
    model = calc_model(records, node, dst_ip.version, local, config)
    answer = explain(model, model.node, src_ip, src_port, dst_ip, dst_port, proto)
    host = f"[{dst_ip}]" if dst_ip.version == 6 else str(dst_ip)
    return {
        "node": node,
        "from": source,
        "to": f"{host}:{dst_port}/{proto}",
        "nodeIPs": [str(ip) for ip in model.node.node_ips],
        "answer": answer.to_dict(),
        "text": render_answer(answer),
    }


def render_trace(doc: dict) -> str:
    return f"on {doc['node']}, {doc['from']} -> {doc['to']}\n{doc['text']}"
