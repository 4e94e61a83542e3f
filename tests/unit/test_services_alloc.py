"""VIP and nodePort allocation on a real SQLite store, over generated create/set/rm sequences:
no VIP or nodePort is ever held by two Services, the index keys are exactly what the live
Services hold, an exhausted CIDR or range is code 101, a taken explicit one code 7 naming its
holder; and a create that loses its txn to a rival re-plans and takes the next free VIP."""

from __future__ import annotations

import tempfile
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from cni.spec.errors import AddressExhausted, InvalidConfig
from services.allocate import ServiceConflict, ServiceNotFound, create_service
from services.ops.edit import change, create, remove, set_settings
from services.record import ServiceRecord
from store.keys import NODE_PORTS, SERVICE_IPS
from store.sqlite import SqliteStore

NAMES = ["a", "b", "c", "d", "e", "f", "g"]
KINDS = ["ClusterIP", "NodePort", "LoadBalancer"]
NODE_PORT_KINDS = ("NodePort", "LoadBalancer")  # a LoadBalancer implies nodePorts
VIPS = ["10.96.0.1", "10.96.0.3", "fd00:96::2"]


def spec(name: str, kind: str, vip: str | None, node_port: int | None) -> dict:
    port = {"name": "p", "port": 80, **({"nodePort": node_port} if node_port else {})}
    return {
        "namespace": "ns",
        "name": name,
        "type": kind,
        "ports": [port, {"name": "q", "port": 53, "protocol": "UDP"}],
        **({"clusterIPs": [vip]} if vip else {}),
    }


class Services(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.store = SqliteStore(f"{self.dir.name}/store.db")
        set_settings(self.store, ["10.96.0.0/29", "fd00:96::/126"], "30000-30003")
        self.live: dict[str, ServiceRecord] = {}

    def teardown(self) -> None:
        self.store.close()
        self.dir.cleanup()

    @rule(
        name=st.sampled_from(NAMES),
        kind=st.sampled_from(KINDS),
        vip=st.none() | st.sampled_from(VIPS),
        node_port=st.none() | st.integers(30000, 30003),
    )
    def create(self, name, kind, vip, node_port) -> None:
        try:
            doc = create(
                self.store, spec(name, kind, vip, node_port if kind in NODE_PORT_KINDS else None)
            )
        except (ServiceConflict, AddressExhausted) as exc:
            assert name in self.live or self.holder(vip, node_port) or exc.code == 101, exc
            return
        assert name not in self.live
        self.live[name] = ServiceRecord.from_dict("k", doc["service"])

    def holder(self, vip: str | None, node_port: int | None) -> bool:
        held = {k for r in self.live.values() for k in r.index_keys()}
        return f"{SERVICE_IPS}{vip}" in held or f"{NODE_PORTS}TCP/{node_port}" in held

    @rule(name=st.sampled_from(NAMES), kind=st.sampled_from(KINDS))
    def retype(self, name, kind) -> None:
        lb = {"loadBalancerIPs": ["198.51.100.7"]} if kind == "LoadBalancer" else {}
        try:
            doc = change(self.store, "ns", name, {"type": kind, **lb})
        except (ServiceNotFound, AddressExhausted) as exc:
            assert name not in self.live or exc.code == 101
            return
        old, new = self.live[name], ServiceRecord.from_dict("k", doc["service"])
        assert new.cluster_ips == old.cluster_ips
        if kind in NODE_PORT_KINDS and old.type in NODE_PORT_KINDS:
            assert new.ports == old.ports  # allocations stay
        assert new.load_balancer_ips == (("198.51.100.7",) if lb else ())  # gone with the type
        self.live[name] = new

    @rule(name=st.sampled_from(NAMES))
    def rm(self, name) -> None:
        try:
            remove(self.store, "ns", name)
        except ServiceNotFound:
            assert name not in self.live
            return
        del self.live[name]

    @invariant()
    def every_node_port_service_has_its_node_ports(self) -> None:
        for record in self.live.values():
            assert all(p.node_port for p in record.ports) == (record.type in NODE_PORT_KINDS)

    @invariant()
    def nothing_is_held_twice_and_the_index_is_exact(self) -> None:
        held = Counter(k for r in self.live.values() for k in r.index_keys())
        assert all(n == 1 for n in held.values()), held
        index = {
            kv.key: kv.value.decode()
            for prefix in (SERVICE_IPS, NODE_PORTS)
            for kv in self.store.range(prefix)
        }
        assert index == {k: r.ref for r in self.live.values() for k in r.index_keys()}


def test_allocation_never_repeats():
    run_state_machine_as_test(
        Services,
        settings=settings(max_examples=60, stateful_step_count=30, deadline=None, database=None),
    )


class RivalFirst:
    """A store whose first txn is preceded by a rival's create (the race a real one loses)."""

    def __init__(self, store: SqliteStore) -> None:
        self.store, self.txns = store, 0

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    def txn(self, compares, ops):
        self.txns += 1
        if self.txns == 1:
            create_service(self.store, spec("rival", "ClusterIP", None, None))
        return self.store.txn(compares, ops)


def test_a_create_that_loses_its_txn_re_plans(tmp_path):
    store = SqliteStore(str(tmp_path / "store.db"))
    set_settings(store, ["10.96.0.0/29"], "30000-30003")
    racing = RivalFirst(store)
    mine = create_service(racing, spec("mine", "NodePort", None, None))
    rival = ServiceRecord.from_bytes("k", store.get("/pycni/v1/services/ns/rival").value)
    assert racing.txns == 2
    assert rival.cluster_ips == ("10.96.0.1",) and mine.cluster_ips == ("10.96.0.2",)
    store.close()


def test_a_spec_that_does_not_fit_the_settings_is_refused(tmp_path):
    store = SqliteStore(str(tmp_path / "store.db"))
    set_settings(store, ["10.96.0.0/29"], "30000-30003")
    with pytest.raises(InvalidConfig, match=r"clusterIPs\[0\]: 10.97.0.1 is in no service CIDR"):
        create(store, spec("x", "ClusterIP", "10.97.0.1", None))
    create(store, spec("y", "NodePort", None, 30003))
    with pytest.raises(InvalidConfig, match="Service ns/y holds nodePort 30003"):
        set_settings(store, ["10.96.0.0/29"], "30000-30002")
    store.close()
