"""This node's attached Pods laid over the API's Pod objects (netpol/attached.py), the ADD's
wait for them (``NetpolSync.settle_attached``), the Pod an ADD names
(plugins/bridge/isolation.py) and pycni-bridge's step that settles it (plugins/bridge/add.py)."""

from __future__ import annotations

import ipaddress
import threading
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni.spec.errors import InvalidConfig, TryAgainLater
from common.metrics import Registry
from ipam.records import HandleId, HandleRecord, LeasedIP
from kube.api import Api
from kube.config import KubeConfig
from kube.source import KubeSource
from netpol.attached import AttachedPod, PodObject, calc_attached, calc_pods
from netpol.evaluate import PodInfo
from netpol.from_kube import pod_object
from netpol.sync import NetpolSync
from plugins.bridge.add import AddState, settle_netpol
from plugins.bridge.context import BridgeContext
from plugins.bridge.isolation import calc_attached_pod, parse_pod_identity
from store.base import Put
from store.keys import handle_key
from store.sqlite import SqliteStore
from tests.fixtures.kubeapi import pod
from tests.fuzz.budget import cases


def obj(name: str, ips: tuple[str, ...] = (), uid: str = "u1", ended: bool = False) -> PodObject:
    return PodObject(PodInfo("x", name, ips, {"app": name}, "n1"), uid, ended)


def test_an_attachment_gives_a_pod_object_its_addresses_until_the_api_says_it_ended() -> None:
    new = AttachedPod("x", "a", ("10.0.0.5", "fd00::5"), uid="u1")
    [got] = calc_pods([obj("a")], [new])
    assert (got.ips, dict(got.labels), got.node) == (("10.0.0.5", "fd00::5"), {"app": "a"}, "n1")
    assert calc_pods([obj("a")], []) == ()  # no address anywhere: no part
    [same] = calc_pods([obj("a", ("10.0.0.5", "fd00::5"))], [new])  # the API caught up
    assert same.ips == ("10.0.0.5", "fd00::5")
    [newer] = calc_pods([obj("a", ("10.0.0.4",))], [new])  # a sandbox made again
    assert newer.ips == ("10.0.0.5", "fd00::5")
    assert calc_pods([obj("a", ended=True)], [new]) == ()  # the API wins
    assert calc_pods([], [new]) == ()  # gone from the API: no part
    [other] = calc_pods([obj("a", ("10.0.0.9",), uid="u2")], [new])  # made again, other uid
    assert other.ips == ("10.0.0.9",)
    [anyuid] = calc_pods([obj("a")], [AttachedPod("x", "a", ("10.0.0.6",))])
    assert anyuid.ips == ("10.0.0.6",)


def test_pod_object_keeps_a_pod_without_addresses_and_its_uid() -> None:
    found = pod_object(pod("x", "a", [], "n1", {"app": "a"}, phase="Pending"))
    assert found is not None and found.info.ips == () and found.uid and not found.ended
    done = pod_object(pod("x", "b", ["10.0.0.2"], "n1", phase="Failed"))
    assert done is not None and done.ended
    assert pod_object(pod("x", "h", ["192.168.0.1"], "n1", host_network=True)) is None


def test_the_pod_an_add_names() -> None:
    addresses = [ipaddress.ip_interface("10.0.0.5/24"), ipaddress.ip_interface("fd00::5/64")]
    args = {"K8S_POD_NAMESPACE": "x", "K8S_POD_NAME": "web-0", "K8S_POD_UID": "u1"}
    assert calc_attached_pod(args, addresses) == AttachedPod(
        "x", "web-0", ("10.0.0.5", "fd00::5"), "u1"
    )
    assert calc_attached_pod({"IgnoreUnknown": "1"}, addresses) is None  # no Kubernetes Pod
    bads = (
        ({"K8S_POD_NAMESPACE": "x"}, "K8S_POD_NAME"),
        ({"K8S_POD_NAME": "a"}, "K8S_POD_NAMESPACE"),
        ({"K8S_POD_NAMESPACE": "X_", "K8S_POD_NAME": "a"}, "K8S_POD_NAMESPACE"),
        ({"K8S_POD_NAMESPACE": "x", "K8S_POD_NAME": "a/b"}, "K8S_POD_NAME"),
    )
    for args, key in bads:
        with pytest.raises(InvalidConfig, match=key) as caught:
            parse_pod_identity(args)
        assert caught.value.code == 7


def kube_sync(tmp_path: Path) -> tuple[NetpolSync, KubeSource]:
    """A sync under a Kubernetes source that never starts (no I/O): tests feed its sinks."""
    source = KubeSource(cast(Api, None), KubeConfig(), Registry())
    store = SqliteStore(str(tmp_path / "store.db"))
    sync = NetpolSync("n1", store, Registry(), local_addresses=lambda: (), kube=source)
    for reflector in source.reflectors.values():
        reflector.synced = True
    return sync, source


def test_settle_attached_waits_for_the_pod_object_then_for_a_pass(tmp_path: Path) -> None:
    sync, _source = kube_sync(tmp_path)
    assert sync.kube is not None
    new = AttachedPod("x", "a", ("10.0.0.5",))
    with pytest.raises(TryAgainLater, match="Pod x/a is not known") as caught:
        sync.settle_attached("net/c1/eth0", new, timeout=0.1)
    assert caught.value.code == 11 and not sync.kube.attached
    arrives = threading.Timer(0.05, sync.kube.pods.apply, ("x/a", obj("a")))
    arrives.start()
    with pytest.raises(TryAgainLater, match="Pod x/a is not programmed"):  # no pass ran
        sync.settle_attached("net/c1/eth0", new, timeout=0.6)
    arrives.join()
    assert not sync.kube.attached  # forgotten with the failed ADD
    timer = threading.Timer(0.05, sync.step)
    timer.start()
    sync.settle_attached("net/c1/eth0", new, timeout=5)
    timer.join()
    assert [(p.ref, p.ips) for p in sync.kube.inputs({}).pods] == [("x/a", ("10.0.0.5",))]
    sync.detach("net/c1/eth0")
    sync.detach("net/c1/eth0")  # nothing known: success
    assert sync.kube.inputs({}).pods == ()
    sync.store.close()


class FakeIsolation:
    """What pycni-bridge's step sees of NetworkPolicy (``PodIsolation``), recording calls."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, object]] = []
        self.fail = fail

    def settle(self, key: str, value: bytes) -> None:
        self.calls.append(("settle", key))

    def settle_attached(self, key: str, pod: AttachedPod) -> None:
        self.calls.append(("settle_attached", (key, pod)))
        if self.fail:
            raise TryAgainLater("not yet")

    def detach(self, key: str) -> None:
        self.calls.append(("detach", key))


def step_state(args: dict[str, str]) -> AddState:
    env = SimpleNamespace(args=args)
    state = SimpleNamespace(
        req=SimpleNamespace(env=env),
        ips=[{"address": "10.22.0.5/24"}],
        att=SimpleNamespace(tag="podnet/c1/eth0"),
    )
    return cast(AddState, state)


def bridge_context(netpol: FakeIsolation | None) -> BridgeContext:
    return cast(BridgeContext, SimpleNamespace(netpol=netpol))


def test_the_bridge_step_settles_the_named_pod_and_undoes_it_with_the_add() -> None:
    args = {"K8S_POD_NAMESPACE": "x", "K8S_POD_NAME": "a", "K8S_POD_UID": "u1"}
    fake = FakeIsolation(fail=True)
    with ExitStack() as undo, pytest.raises(TryAgainLater):
        settle_netpol(bridge_context(fake), step_state(args), undo)
    assert fake.calls == [
        ("settle_attached", ("podnet/c1/eth0", AttachedPod("x", "a", ("10.22.0.5",), "u1"))),
        ("detach", "podnet/c1/eth0"),  # the rollback
    ]
    quiet = FakeIsolation()
    with ExitStack() as undo:
        settle_netpol(bridge_context(quiet), step_state({}), undo)  # no Pod named
    assert quiet.calls == []
    bad = {"K8S_POD_NAMESPACE": "x", "K8S_POD_NAME": "A_"}
    with ExitStack() as undo:  # no enforcement: the names are none of its business
        settle_netpol(bridge_context(None), step_state(bad), undo)


def handle(cid: str, node: str, **attributes: str) -> HandleRecord:
    ips = (LeasedIP(f"10.22.0.{len(cid)}/24", None, "p", "10.22.0.0/26"),)
    return HandleRecord(HandleId("podnet", cid, "eth0"), ips, {"node": node, **attributes})


def test_a_restarted_pycnid_takes_its_attachments_back_from_the_ipam_handles(
    tmp_path: Path,
) -> None:
    pod_ = {"namespace": "x", "pod": "a", "podUID": "u1"}
    records = [
        handle("c1", "n1", **pod_),
        handle("c22", "n2", **pod_),  # another node's
        handle("c333", "n1"),  # no Pod named (podman, cnitool)
    ]
    assert calc_attached(records, "n1") == {
        "podnet/c1/eth0": AttachedPod("x", "a", ("10.22.0.2",), "u1")
    }
    sync, _source = kube_sync(tmp_path)
    assert sync.kube is not None
    sync.store.txn([], [Put(handle_key("podnet/c1/eth0"), records[0].to_bytes())])
    sync.store.txn([], [Put(handle_key("podnet/bad/eth0"), b"{")])  # logged, skipped
    sync.take_back_attachments()
    assert sync.kube.attached == {"podnet/c1/eth0": AttachedPod("x", "a", ("10.22.0.2",), "u1")}
    sync.store.close()


def is_dns_label(text: str, limit: int = 63) -> bool:
    """RFC 1123 label, written out (not the parser's regular expression)."""
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-")
    return 0 < len(text) <= limit and set(text) <= allowed and text[0] != "-" and text[-1] != "-"


def is_dns_subdomain(text: str) -> bool:
    return 0 < len(text) <= 253 and all(is_dns_label(p, 253) for p in text.split("."))


NAME_TEXT = st.one_of(
    st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,8}[a-z0-9])?", fullmatch=True),
    st.text(max_size=12),
    st.sampled_from(["", "x\n", "-a", "a-", "a..b", "A", "a/b", "a" * 64, "b" * 254]),
)


@cases(300)
@given(
    namespace=st.none() | NAME_TEXT,
    name=st.none() | NAME_TEXT,
    extra=st.dictionaries(st.sampled_from(["K8S_POD_UID", "IgnoreUnknown"]), st.text(max_size=5)),
)
def test_any_pod_names_give_the_pod_none_or_code_7_naming_the_key(namespace, name, extra):
    args = dict(extra)
    if namespace is not None:
        args["K8S_POD_NAMESPACE"] = namespace
    if name is not None:
        args["K8S_POD_NAME"] = name
    try:
        found = parse_pod_identity(args)
    except InvalidConfig as exc:
        assert exc.code == 7
        bad_ns = namespace is None or not is_dns_label(namespace)
        key = "K8S_POD_NAMESPACE" if bad_ns else "K8S_POD_NAME"
        assert key in exc.msg
        assert not (namespace is None and name is None)
        assert bad_ns or name is None or not is_dns_subdomain(name)
        return
    if namespace is None and name is None:
        assert found is None
    else:
        assert namespace is not None and name is not None
        assert is_dns_label(namespace) and is_dns_subdomain(name)
        assert found == (namespace, name)
