"""Pods, Namespaces and NetworkPolicies from the (fake) API server as the policy model's inputs
(netpol/from_kube.py): followed by the same reflectors as Services, converted as they arrive,
and judged by the model: a label change, a namespace relabel and a policy change reach the
verdict."""

from __future__ import annotations

import threading
from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from common.metrics import Registry
from kube.api import open_api
from kube.config import KubeConfig
from kube.source import KubeSource
from netpol.attached import AttachedPod, PodObject, calc_pods
from netpol.evaluate import PodInfo, PolicyInputs, evaluate
from netpol.from_kube import PolicyObjects, network_policy, pod_info
from netpol.members import group_by_namespace
from netpol.policy import NetworkPolicy
from tests.fixtures.kubeapi import FakeKubeAPI, namespace, pod
from tests.fixtures.kubeapi import network_policy as np_object
from tests.fixtures.waiting import wait_for
from tests.fuzz.budget import cases

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


class StillSource:
    """A source that hands the sinks nothing itself: the test applies to them."""

    def follow(self, kind: object, sink: object) -> None:
        pass


REFS = st.tuples(st.sampled_from("xy"), st.sampled_from("abc"))
POD_OBJECTS = st.builds(
    lambda ref, ip, app, node, ended, uid: PodObject(
        PodInfo(ref[0], ref[1], (f"10.0.0.{ip}",) if ip else (), {"app": app}, node),
        uid,
        ended,
    ),
    REFS,
    st.integers(0, 3),
    st.sampled_from(["web", "db"]),
    st.sampled_from(["n1", "n2"]),
    st.booleans(),
    st.sampled_from(["", "u1", "u2"]),
)
ATTACHED = st.builds(
    lambda ref, ip, uid: AttachedPod(ref[0], ref[1], (f"10.0.1.{ip}",), uid),
    REFS,
    st.integers(1, 3),
    st.sampled_from(["", "u1"]),
)
KEYS = st.sampled_from(["net/c1/eth0", "net/c2/eth0", "net/c3/eth0"])


@cases(150)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("put"), POD_OBJECTS),
            st.tuples(st.just("delete"), REFS),
            st.tuples(  # a relist; a hostNetwork Pod is held as None (``pod_object``)
                st.just("relist"), st.tuples(st.lists(POD_OBJECTS, max_size=4), st.sets(REFS))
            ),
            st.tuples(st.just("attach"), st.tuples(KEYS, ATTACHED)),
            st.tuples(st.just("attach_all"), st.dictionaries(KEYS, ATTACHED, max_size=2)),
            st.tuples(st.just("detach"), KEYS),
            st.tuples(st.just("namespace"), st.tuples(st.sampled_from("xy"), st.booleans())),
            st.tuples(st.just("policy"), st.tuples(REFS, st.booleans())),  # put, or deleted
            st.tuples(st.just("policies"), st.sets(REFS)),  # a relist
            st.tuples(st.just("inputs"), st.none()),
        ),
        max_size=25,
    )
)
def test_the_inputs_equal_a_join_of_everything_after_every_change(steps) -> None:
    """``inputs()`` joins again only the Pods whose object or attachments changed: after
    any history of puts, deletes, relists, attachments and detachments its Pods equal
    ``calc_pods`` over every object and attachment (grouped by namespace alike), and the
    namespaces' labels and the policies (sorted, and by namespace) are the objects held."""
    objects = PolicyObjects(cast(KubeSource, StillSource()), lambda: None)
    for op, arg in [*steps, ("inputs", None)]:
        if op == "put":
            objects.pods.apply(arg.info.ref, arg)
        elif op == "delete":
            objects.pods.apply("/".join(arg), None)
        elif op == "relist":
            found, host = arg
            listed: dict[str, PodObject | None] = {"/".join(ref): None for ref in host}
            objects.pods.replace({**listed, **{o.info.ref: o for o in found}})
        elif op == "attach":
            objects.attach(*arg)
        elif op == "attach_all":
            objects.attach_all(arg)
        elif op == "detach":
            objects.detach(arg)
        elif op == "namespace":
            name, labelled = arg
            objects.namespaces.apply(name, {"team": name} if labelled else {})
        elif op == "policy":
            (ns, name), put = arg
            objects.policies.apply(f"{ns}/{name}", NetworkPolicy(ns, name) if put else None)
        elif op == "policies":
            objects.policies.replace({f"{ns}/{n}": NetworkPolicy(ns, n) for ns, n in arg})
        else:
            got = objects.inputs({})
            every = calc_pods(filter(None, objects.pods.items.values()), objects.attached.values())
            assert got.pods == every
            assert got.groups == group_by_namespace(every)
            assert got.namespaces == objects.namespaces.items
            held = tuple(sorted(objects.policies.items.values(), key=lambda p: p.ref))
            assert got.policies == held
            assert got.policies_in == PolicyInputs(policies=held).policies_in
