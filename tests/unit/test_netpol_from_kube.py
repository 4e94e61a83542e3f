"""Pods, Namespaces and NetworkPolicies from the (fake) API server as the policy model's inputs
(netpol/from_kube.py): followed by the same reflectors as Services, converted as they arrive,
and judged by the model: a label change, a namespace relabel and a policy change reach the
verdict."""

from __future__ import annotations

import threading

from common.metrics import Registry
from kube.api import open_api
from kube.config import KubeConfig
from kube.source import KubeSource
from netpol.evaluate import evaluate
from netpol.from_kube import PolicyObjects, network_policy, pod_info
from tests.fixtures.kubeapi import FakeKubeAPI, namespace, pod
from tests.fixtures.kubeapi import network_policy as np_object
from tests.fixtures.waiting import wait_for

ALLOW_FROM_Y = {"from": [{"namespaceSelector": {"matchLabels": {"team": "y"}}}]}


def with_ports(obj: dict, *ports: tuple[str, str, int]) -> dict:
    obj["spec"]["containers"][0]["ports"] = [
        {"name": n, "protocol": p, "containerPort": c} for n, p, c in ports
    ]
    return obj


def test_pod_info_reads_addresses_labels_node_and_named_ports_with_protocol() -> None:
    info = pod_info(
        with_ports(
            pod("x", "a", ["10.1.0.5", "fd00::5"], "n1", {"pod": "a"}),
            ("serve-80-tcp", "TCP", 80),
            ("dns", "UDP", 53),
        )
    )
    assert info is not None
    assert (info.ref, info.ips, dict(info.labels), info.node) == (
        "x/a",
        ("10.1.0.5", "fd00::5"),
        {"pod": "a"},
        "n1",
    )
    assert info.resolve("dns", "UDP") == 53 and info.resolve("dns", "TCP") is None


def test_host_network_ended_and_unaddressed_pods_take_no_part() -> None:
    assert pod_info(pod("x", "h", ["192.168.0.1"], "n1", host_network=True)) is None
    assert pod_info(pod("x", "done", ["10.1.0.9"], "n1", phase="Succeeded")) is None
    assert pod_info(pod("x", "new", [], "n1", phase="Pending")) is None


def test_a_listed_policy_without_kind_parses_and_a_refused_one_is_a_value_error() -> None:
    obj = np_object("x", "allow", {"matchLabels": {"pod": "a"}}, ingress=[ALLOW_FROM_Y])
    del obj["apiVersion"], obj["kind"]  # list items come without them
    assert network_policy(obj).ref == "x/allow"
    bad = np_object("x", "bad", {"matchExpressions": [{"key": "k", "operator": "Near"}]})
    try:
        network_policy(bad)
    except ValueError as exc:
        assert "spec.podSelector.matchExpressions[0].operator" in str(exc)
    else:
        raise AssertionError("an unknown operator was taken")


def test_the_model_follows_the_api_server(kube_api: FakeKubeAPI, tmp_path) -> None:
    config = KubeConfig(kubeconfig=kube_api.write_kubeconfig(str(tmp_path / "kc")))
    for ns, labels in (("x", {}), ("y", {"team": "y"})):
        kube_api.put(namespace(ns, labels))
    kube_api.put(pod("x", "a", ["10.1.0.1"], "n1", {"pod": "a"}))
    kube_api.put(pod("y", "b", ["10.1.0.2"], "n2", {"pod": "b"}))
    kube_api.put(pod("x", "c", ["10.1.0.3"], "n2", {"pod": "c"}))
    kube_api.put(np_object("x", "allow", {"matchLabels": {"pod": "a"}}, ingress=[ALLOW_FROM_Y]))
    changed = threading.Event()
    source = KubeSource(open_api(config), config, Registry())
    objects = PolicyObjects(source, changed.set)
    source.start()
    try:
        wait_for("the three kinds listed", objects.synced, 10)

        def allowed(src: str) -> bool:
            return evaluate(objects.inputs({}), src, "10.1.0.1", "TCP", 80).allowed

        assert allowed("10.1.0.2") and not allowed("10.1.0.3")
        kube_api.put(namespace("x", {"team": "y"}))  # x now matches the namespaceSelector
        wait_for("the namespace relabel", lambda: allowed("10.1.0.3"), 10)
        kube_api.put(pod("x", "a", ["10.1.0.1"], "n1", {"pod": "other"}))  # a unselected
        kube_api.put(namespace("x", {}))
        wait_for("the pod relabel", lambda: allowed("10.1.0.3"), 10)
        kube_api.put(pod("x", "a", ["10.1.0.1"], "n1", {"pod": "a"}))
        wait_for("isolated again", lambda: not allowed("10.1.0.3"), 10)
        kube_api.delete("NetworkPolicy", "x", "allow")
        wait_for("the policy gone", lambda: allowed("10.1.0.3"), 10)
        assert changed.is_set()
    finally:
        source.stop()
