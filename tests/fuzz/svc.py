"""pycni-svc under generated input: its netconf, generated CNI_ARGS, the records every case must
leave alone, and an independent statement of what an accepted ADD publishes.

Two records stand for what a request must never remove: the anchor attachment's endpoint
(network ``fzanchor``, published by a real ADD) and another node's endpoint in the fuzzed
network ``fzsvc`` (written into the store directly). Generated DELs and CHECKs may name their
Pods (``anchor``, ``remote``): a late DEL of another sandbox must leave them.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

from hypothesis import strategies as st

from services.record import EndpointRecord
from store.base import Put

from .node import FuzzNode
from .strategies import result_in

NETWORK = "fzsvc"
NAMESPACE = "fz"
SVC_ARGS = {
    "cni": {
        "labels": [{"key": "app", "value": "web"}],
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
    }
}
ADD_PODS = ("web-0", "anchor", "db.x-1")  # an ADD is deleted again: never the remote key
ALL_PODS = ADD_PODS + ("remote",)
REMOTE = EndpointRecord(
    NAMESPACE,
    "remote",
    "eth0",
    ("10.91.0.9",),
    {"app": "web"},
    "node2",
    {"http": 8080},
    "fzremote",
    NETWORK,
)


# args.cni shapes a runtime sends, odd but plausible ones, and refused ones
CNI_SECTIONS = (
    {"labels": {"app": "web", "tier": "front"}},
    {"labels": {"app": ""}},
    {"labels": [{"key": "app", "value": "a"}, {"key": "app", "value": "b"}]},
    {"labels": {"k8s.io/name": "web", "A_b.c": "x" * 63}},
    {"labels": None},
    {"labels": []},
    {"ports": []},
    {
        "ports": [
            {"name": "dns", "containerPort": 53, "protocol": "UDP"},
            {"name": "a" * 15, "containerPort": 65535},
        ]
    },
    {"ports": [{"name": "sctp-1", "containerPort": 1, "protocol": "SCTP"}]},
    {"ports": [{"name": "http", "containerPort": 80}, {"name": "http", "containerPort": 81}]},
    {"ports": [{"containerPort": 80}]},
    {"labels": {"app": "web\n"}},
    {"ports": [{"name": "http\n", "containerPort": 80}]},
    {"mac": "x", "ips": ["10.0.0.1"]},
    {"labels": {"app": "a" * 64}},
    {"labels": {"-app": "web"}},
)


def svc_conf(fz: FuzzNode, command: str, version: str, with_prev: bool) -> dict:
    """A valid pycni-svc netconf after pycni-bridge (prevResult in the netconf's version)."""
    conf: dict = {
        "cniVersion": version,
        "name": NETWORK,
        "type": "pycni-svc",
        "daemonSocket": fz.socket,
        "args": SVC_ARGS,
    }
    if command == "GC":
        conf["cni.dev/valid-attachments"] = [{"containerID": "fzother", "ifname": "eth0"}]
    if with_prev and command in ("ADD", "DEL", "CHECK"):
        conf["prevResult"] = result_in(version, fz.pods[0].path)
    return conf


def add_svc_anchors(fz: FuzzNode) -> None:
    """The anchor attachment's endpoint (a real ADD) and another node's, in the store."""
    conf = {
        "cniVersion": "1.1.0",
        "name": "fzanchor",
        "type": "pycni-svc",
        "args": SVC_ARGS,
        "prevResult": fz.anchor["result"],
    }
    env = fz.env(
        "ADD",
        "fzanchor",
        "eth9",
        fz.pods[0].path,
        f"K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME=anchor",
    )
    exit_code, stdout = fz.request("svc", env, json.dumps(conf).encode(), fz.pods[0].path)
    assert exit_code == 0, f"svc anchor ADD failed: {stdout}"
    store = fz.open_store()
    try:
        store.txn([], [Put(REMOTE.key, REMOTE.to_bytes())])
    finally:
        store.close()
    assert len(fz.endpoints()) == 2


# --- CNI_ARGS ------------------------------------------------------------------------------

ARG_KEYS = (
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "PYCNI_LABELS",
    "IgnoreUnknown",
    "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID",
    "X",
)
odd_values = st.one_of(
    st.sampled_from(
        [
            "",
            "a=b",
            "=",
            "web-1",
            "Web",
            "fz",
            "ü",
            "🙂",
            "a" * 254,
            "app:web=x",
            "app:",
            ":web",
            "app:web,,tier:x",
            "a b",
            "default",
            "x.y",
        ]
    ),
    st.text(st.characters(codec="utf-8", exclude_characters=";"), max_size=12),
    st.builds(lambda n, c: c * n, st.sampled_from([1000, 70_000]), st.sampled_from("aü=")),
)


@st.composite
def cni_args_text(draw, pods: tuple[str, ...]) -> str:
    """Well-formed CNI_ARGS (every pair KEY=VALUE): the Pod's pairs, now and then one left
    out, mixed with repeated keys, '=' in values, empty, non-ASCII and huge values."""
    pairs = [
        ("IgnoreUnknown", "1"),
        ("K8S_POD_NAMESPACE", NAMESPACE),
        ("K8S_POD_NAME", draw(st.sampled_from(pods))),
        ("PYCNI_LABELS", "app:web"),
    ]
    pairs = [pair for pair in pairs if draw(st.integers(0, 7)) < 7]
    pairs += draw(st.lists(st.tuples(st.sampled_from(ARG_KEYS), odd_values), max_size=3))
    sep = draw(st.sampled_from([";", ";", "; ", ";;"]))
    tail = draw(st.sampled_from(["", "", ";", " "]))
    return sep.join(f"{k}={v}" for k, v in draw(st.permutations(pairs))) + tail


def any_cni_args(pods: tuple[str, ...]) -> st.SearchStrategy[str]:
    """Mostly well-formed CNI_ARGS; sometimes a pair without '=', or text that is not UTF-8."""
    odd = st.sampled_from(
        ["novalue", "=x", "K8S_POD_NAME", "a;b=c", "K8S_POD_NAME=\udcff", "\ud800=1", ";", " = "]
    )
    return st.one_of(*[cni_args_text(pods)] * 4, odd, st.text(max_size=16))


def model_args(text: str) -> dict[str, str]:
    """CNI_ARGS as the convention reads it: ';'-separated pairs, split at the first '=',
    surrounding blanks dropped, the last of a repeated key wins."""
    pairs = [p.strip().partition("=") for p in text.split(";") if p.strip()]
    return {key: value for key, _, value in pairs}


# --- what an accepted ADD publishes, stated apart from cni/plugins/svc* --------------------------


def expected_ips(prev: dict, ifname: str) -> tuple[str, ...]:
    names = [i.get("name") for i in prev.get("interfaces") or []]
    return tuple(
        str(ipaddress.ip_interface(ip["address"]).ip)
        for ip in prev.get("ips") or []
        if ip.get("interface") is None or names[ip["interface"]] == ifname
    )


def expected_labels(config: dict, args: dict[str, str]) -> dict[str, str]:
    labels = ((config.get("args") or {}).get("cni") or {}).get("labels")
    if labels is None:
        pairs = [p.partition(":") for p in args.get("PYCNI_LABELS", "").split(",") if p]
        return {key: value for key, _, value in pairs}
    if isinstance(labels, list):
        return {item["key"]: item["value"] for item in labels}
    return dict(labels)


def expected_port_items(config: dict) -> list[dict]:
    return ((config.get("args") or {}).get("cni") or {}).get("ports") or []


def expected_ports(config: dict) -> dict[str, int]:
    return {item["name"]: item["containerPort"] for item in expected_port_items(config)}


def expected_port_protocols(config: dict) -> dict[str, str]:
    """The ports whose protocol is not TCP (TCP is what a port without one means)."""
    items = expected_port_items(config)
    return {i["name"]: i["protocol"] for i in items if i.get("protocol", "TCP") != "TCP"}


def expected_record(config: dict, args_text: str, cid: str, ifname: str) -> EndpointRecord:
    args = model_args(args_text)
    return EndpointRecord(
        args["K8S_POD_NAMESPACE"],
        args["K8S_POD_NAME"],
        ifname,
        expected_ips(config["prevResult"], ifname),
        expected_labels(config, args),
        "node1",
        expected_ports(config),
        cid,
        str(config["name"]),
        port_protocols=expected_port_protocols(config),
    )


def changed_keys(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


# Kubernetes names, matched whole (fullmatch: a name has no trailing newline)
K8S_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{K8S_NAME}")
LABEL_VALUE = re.compile(rf"({K8S_NAME})?")
PORT_NAME = re.compile(r"(?=.{1,15}\Z)(?=.*[a-z])[a-z0-9]+(-[a-z0-9]+)*")


def named(pattern: re.Pattern, text: str) -> bool:
    return bool(pattern.fullmatch(text))


def record_problems(record: EndpointRecord) -> list[str]:
    """What an accepted record holds that no Pod spec could: label keys and values, port names
    that are not Kubernetes names, ports out of range."""
    problems = [
        f"label {k!r}: {v!r}"
        for k, v in record.labels.items()
        if not (named(LABEL_KEY, k) and named(LABEL_VALUE, v))
    ]
    return problems + [
        f"port {n!r}: {p!r}"
        for n, p in record.ports.items()
        if not (named(PORT_NAME, n) and 1 <= p <= 65535)
    ]
