"""healthCheckNodePort's pure parts and its server bookkeeping, with generated inputs.

- ``calc_health`` counts this node's ready endpoints that serve a port of the Service
  (checked against a count written from the records), only for a Service that has one;
- ``render_health`` answers kube-proxy's JSON, 200 exactly with local endpoints and a healthy
  proxy;
- ``ProxyHealth`` is unhealthy exactly while the passes have been refused for its timeout;
- ``HealthServers`` (over a fake server) after any sequence of passes and bind changes runs
  one server per wanted port and bind address, each answering its Service's latest target,
  and none other; a port that could not be bound is tried again on a later pass;
- allocation: a LoadBalancer Service with externalTrafficPolicy Local gets one too, and any
  sequence of creates, changes and removals leaves the nodeports index exactly the union of
  the Services' index keys, no port held twice."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cni.spec.errors import CNIError
from services.allocate import calc_health_check_port
from services.ops.edit import change, create, remove, set_settings
from services.proxy.health import (
    EVERY_ADDRESS,
    HealthServers,
    HealthTarget,
    ProxyHealth,
    calc_health,
    render_health,
)
from services.proxy.view import Records
from services.record import EndpointRecord, ServicePort, ServiceRecord, ServiceSettings
from store.base import KV
from store.keys import NODE_PORTS, SERVICES
from store.sqlite import SqliteStore

CONDITIONS = st.fixed_dictionaries(
    {"ready": st.booleans(), "serving": st.booleans(), "terminating": st.booleans()}
)


def kv(key: str, value: bytes) -> KV:
    return KV(key, value, 1, 1)


def web(kind: str = "NodePort", policy: str = "Local", hc: int = 30005) -> ServiceRecord:
    return ServiceRecord(
        "ns",
        "web",
        kind,
        (ServicePort("http", "TCP", 80, "http", 30000),),
        ("10.96.0.5",),
        (),
        {"app": "web"},
        external_traffic_policy=policy,
        health_check_node_port=hc,
    )


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["n1", "n2"]),
            CONDITIONS,
            st.booleans(),  # names the container port "http"
            st.sampled_from([{"app": "web"}, {"app": "db"}]),
        ),
        max_size=6,
    ),
    st.sampled_from([("NodePort", "Local"), ("LoadBalancer", "Local"), ("NodePort", "Cluster")]),
)
def test_the_count_is_this_nodes_ready_endpoints_serving_a_port(eps, kind_policy):
    records = Records()
    svc = web(*kind_policy)
    records.apply(kv(svc.key, svc.to_bytes()))
    made = []
    for i, (node, conditions, named, labels) in enumerate(eps):
        ports = {"http": 8080} if named else {}
        e = EndpointRecord("ns", f"p{i}", "eth0", (f"10.0.0.{i + 2}",), labels, node, ports)
        e = replace(e, **conditions)
        records.apply(kv(e.key, e.to_bytes()))
        made.append(e)
    target = calc_health(records, svc.key, "n1")
    if kind_policy[1] != "Local":
        assert target is None
        return
    expected = sum(
        1
        for e in made
        if e.node == "n1" and e.ready and e.labels == {"app": "web"} and "http" in e.ports
    )
    assert target == HealthTarget(30005, "ns", "web", expected)
    assert calc_health(records, SERVICES + "ns/gone", "n1") is None


@given(st.integers(0, 5), st.text(min_size=1, max_size=5), st.booleans())
def test_the_answer_is_kube_proxys_json_and_200_only_with_local_endpoints(count, name, healthy):
    status, body = render_health(HealthTarget(30005, "ns", name, count), healthy)
    assert status == (200 if count and healthy else 503)
    assert json.loads(body) == {
        "service": {"namespace": "ns", "name": name},
        "localEndpoints": count,
        "serviceProxyHealthy": healthy,
    }


@given(st.lists(st.tuples(st.floats(0, 40), st.booleans()), max_size=12))
def test_the_proxy_is_unhealthy_once_refused_for_its_timeout(passes):
    now = [0.0]
    health = ProxyHealth(60.0, lambda: now[0])
    first_refused: float | None = None  # the first refusal of the current run of them
    for advance, applied in passes:
        now[0] += advance
        health.note_pass(applied)
        first_refused = None if applied else (now[0] if first_refused is None else first_refused)
        assert health.is_healthy() == (first_refused is None or now[0] - first_refused < 60)
    now[0] += 61
    assert health.is_healthy() == (first_refused is None)


class FakeServer:
    def __init__(self, target: HealthTarget, log: list) -> None:
        self.target, self.closed, self.log = target, False, log

    def close(self) -> None:
        assert not self.closed
        self.closed = True
        self.log.append(self)


class Passes(RuleBasedStateMachine):
    """Passes hand in targets of Services s0..s3 on ports 1..3 (two Services never share a
    port, as the index guarantees: a Service takes a port only when no other has it)."""

    def __init__(self) -> None:
        super().__init__()
        self.busy: set[int] = set()  # ports something else holds: start fails
        self.closed: list[FakeServer] = []
        self.servers = HealthServers(ProxyHealth(60.0), self.start)
        self.model: dict[str, HealthTarget] = {}
        self.binds: tuple[str, ...] = EVERY_ADDRESS

    def start(self, target: HealthTarget, address: str) -> FakeServer:
        assert address in self.binds
        if target.port in self.busy:
            raise OSError(98, "Address already in use")
        return FakeServer(target, self.closed)

    @rule(
        changes=st.dictionaries(
            st.sampled_from(["s0", "s1", "s2", "s3"]),
            st.none() | st.tuples(st.integers(1, 3), st.integers(0, 2)),
            max_size=3,
        )
    )
    def apply_pass(self, changes):
        targets: dict[str, HealthTarget | None] = {}
        for key, value in changes.items():
            if value is None:
                targets[key] = None
                continue
            port, count = value
            others = {t.port for k, t in self.model.items() if k != key and k not in targets}
            others |= {t.port for t in targets.values() if t is not None}
            if port in others:
                continue
            targets[key] = HealthTarget(port, "ns", key, count)
        self.servers.apply(targets)
        for key, target in targets.items():
            if target is None:
                self.model.pop(key, None)
            else:
                self.model[key] = target

    @rule(binds=st.sampled_from([EVERY_ADDRESS, (), ("192.168.0.2",), ("192.168.0.2", "fd01::2")]))
    def rebind(self, binds):
        self.binds = binds
        self.servers.apply({}, binds)

    @rule(port=st.integers(1, 3))
    def hold_port(self, port):
        self.busy.add(port)

    @rule()
    def free_ports(self):
        self.busy.clear()
        self.servers.apply({})

    @invariant()
    def one_server_per_wanted_port_and_address_answering_its_latest_target(self):
        running = self.servers.running
        wanted = {t.port: t for t in self.model.values()}
        keys = {(port, address) for port in wanted for address in self.binds}
        assert set(running) <= keys
        missing = {port for port, _ in keys - set(running)}
        assert missing <= self.busy  # only what could not be bound is missing
        for (port, _), server in running.items():
            assert server.target == wanted[port] and not server.closed
        assert all(s.closed for s in self.closed)


TestPasses = Passes.TestCase
TestPasses.settings = settings(max_examples=60, stateful_step_count=12, deadline=None)


def test_a_load_balancer_with_etp_local_gets_one_and_cluster_policy_none():
    held = {f"{NODE_PORTS}TCP/30001": "ns/other"}
    settings_ = ServiceSettings(("10.96.0.0/28",), (30000, 30009))
    lb = web("LoadBalancer", hc=0)
    assert lb.wants_health_check and calc_health_check_port(lb, settings_, held) == 30002
    assert calc_health_check_port(web("LoadBalancer", "Cluster", 0), settings_, held) == 0
    assert calc_health_check_port(web(hc=30007), settings_, held) == 30007


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["create", "set", "rm"]),
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from(["Local", "Cluster"]),
            st.none() | st.integers(30000, 30007),
        ),
        max_size=10,
    )
)
def test_the_index_is_the_union_of_what_the_services_hold(ops):
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(f"{tmp}/store.db")
        set_settings(store, ["10.96.0.0/28"], "30000-30007")
        for verb, name, policy, hc in ops:
            spec = {"type": "NodePort", "externalTrafficPolicy": policy, "ports": [{"port": 80}]}
            if hc is not None:
                spec["healthCheckNodePort"] = hc
            try:
                if verb == "create":
                    create(store, {"namespace": "ns", "name": name, **spec})
                elif verb == "set":
                    change(store, "ns", name, spec)
                else:
                    remove(store, "ns", name)
            except CNIError:
                pass  # refused (held, exhausted, absent): nothing written
        services = [ServiceRecord.from_bytes(k.key, k.value) for k in store.range(SERVICES)]
        index = {k.key: k.value.decode() for k in store.range(NODE_PORTS)}
        holds = {k: s.ref for s in services for k in s.index_keys() if k.startswith(NODE_PORTS)}
        assert index == holds
        every = [k for s in services for k in s.index_keys() if k.startswith(NODE_PORTS)]
        assert len(every) == len(set(every))  # no port held by two Services
        for s in services:
            has = bool(s.health_check_node_port)
            assert has == (s.external_traffic_policy == "Local")
            assert not has or 30000 <= s.health_check_node_port <= 30007
            assert s.health_check_node_port not in {p.node_port for p in s.ports}
        store.close()
