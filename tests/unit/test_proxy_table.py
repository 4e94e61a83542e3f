"""The proxy's incremental table (services/proxy/table.py) with the records' dirty tracking
(services/proxy/view.py) against a full render, on generated runs of store events.

The invariant pycnid relies on: after any run of Service and endpoint puts and deletes,
each applied as one pass of only the dirty Services, the table holds exactly what a full
render of the same records holds, and the scripts, replayed on a model of the kernel's
sets, maps and chains, never delete what is absent, never add what is present, never
delete a chain an element still jumps to, and end where the table says.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.nft import Started
from services.proxy.render import (
    TABLE,
    calc_element_types,
    calc_shape_chains,
    is_shape_chain,
)
from services.proxy.sync import calc_plan, run_plan
from services.proxy.table import ServiceTable, TablePlan
from services.proxy.view import Records
from services.record import EndpointRecord, ServicePort, ServiceRecord, ServiceSettings
from store.codec import encode
from store.keys import SERVICES, SERVICES_META, pool_key
from tests.unit.test_proxy_view import kv

NAMES = "abcd"
LOCAL = ["192.168.0.2"]
SELECTOR = st.sampled_from([{"app": "a"}, {"app": "b"}, {"app": "a", "tier": "t"}, {}])


@st.composite
def services(draw) -> ServiceRecord:
    """A Service whose VIPs are its own (the store's index keys make them unique)."""
    name = draw(st.sampled_from(NAMES))
    n = NAMES.index(name) + 5
    vips = draw(st.lists(st.sampled_from([f"10.96.0.{n}", f"fd96::{n}"]), max_size=2, unique=True))
    ports = [
        ServicePort("http", "TCP", 80, draw(st.sampled_from([8080, "web"])), 30080 + n),
        ServicePort("dns", "UDP", 53, 53),
    ]
    return ServiceRecord(
        "ns",
        name,
        draw(st.sampled_from(["ClusterIP", "NodePort"])),
        tuple(draw(st.lists(st.sampled_from(ports), min_size=1, max_size=2, unique=True))),
        tuple(vips),
        (),
        draw(SELECTOR),
        draw(st.sampled_from(["None", "ClientIP"])),
        draw(st.sampled_from([10, 30])),
        draw(st.sampled_from(["Cluster", "Local"])),
        draw(st.sampled_from(["Cluster", "Local"])),
    )


@st.composite
def pods(draw) -> EndpointRecord:
    """An endpoint of three Pods: a run puts, relabels, moves and deletes the same ones."""
    pod = draw(st.sampled_from("xyz"))
    n = "xyz".index(pod) + 2
    return EndpointRecord(
        "ns",
        pod,
        "eth0",
        (f"10.0.0.{n + draw(st.integers(0, 1)) * 10}", f"fd00::{n}"),
        draw(SELECTOR),
        draw(st.sampled_from(["n1", "n2"])),
        draw(st.sampled_from([{}, {"web": 8080}, {"web": 9090}])),
    )


EVENTS = st.tuples(st.sampled_from(["put", "put", "delete"]), services() | pods())


def base_records() -> Records:
    records = Records()
    records.apply(kv(pool_key("pods"), encode({"cidr": "10.0.0.0/16"})))
    records.apply(kv(SERVICES_META, ServiceSettings(("10.96.0.0/16",)).to_bytes()))
    return records


def apply_event(records: Records, store: dict, event) -> None:
    verb, record = event
    if verb == "put":
        store[record.key] = record.to_bytes()
        records.apply(kv(record.key, store[record.key]))
    else:
        store.pop(record.key, None)
        records.apply(kv(record.key, b""), deleted=True)


class Kernel:
    """What a transaction does to a table's elements and chains, as far as a pass needs."""

    LINE = re.compile(rf"^(add|delete) element ip6? {TABLE} (\S+) \{{ (.*) \}}$")

    def __init__(self) -> None:
        self.elements: set[tuple[str, str]] = set()
        self.chains: set[str] = set()

    def run(self, script: str, full: bool) -> None:
        if full:
            self.elements = set()
        for line in script.splitlines():
            self.run_line(line)

    def run_line(self, line: str) -> None:
        if line.startswith("add chain"):
            self.chains.add(line.split()[4])
        elif line.startswith("delete chain"):
            chain = line.split()[4]
            assert chain in self.chains
            assert not any(value.endswith(f"goto {chain}") for _, value in self.elements), chain
            self.chains.discard(chain)
        elif match := self.LINE.match(line):
            verb, name, items = match.groups()
            for item in items.split(", "):
                assert ((name, item) in self.elements) == (verb == "delete"), (line, item)
                (self.elements.discard if verb == "delete" else self.elements.add)((name, item))


def assert_batch_is_the_script(plan: TablePlan) -> None:
    """An update whose script changes elements only carries them as a netlink batch (run
    instead of the script: services/proxy/sync.py run_plan), the same commands in the same
    order (a command's elements in any: they are distinct keys); any other plan runs its
    script."""
    lines = plan.script.splitlines()
    matches = [Kernel.LINE.match(line) for line in lines]
    names = {m.group(2) for m in matches if m}
    # the writable names are the same in both families
    if plan.full or not all(matches) or not names <= set(calc_element_types(4)):
        assert plan.elements is None
        return
    assert plan.elements is not None
    batch = [
        (c.verb, c.set, sorted(k if v is None else f"{k} : {v}" for k, v in c.elements))
        for c in plan.elements.changes
    ]
    assert batch == [(m.group(1), m.group(2), sorted(m.group(3).split(", "))) for m in matches]


def rendered(table: ServiceTable) -> set[tuple[str, str]]:
    return {(e.name, e.render()) for e in table.elements()}


@settings(max_examples=120, deadline=None)
@given(
    steps=st.lists(st.lists(EVENTS, min_size=1, max_size=4), min_size=1, max_size=6),
    family=st.sampled_from([4, 6]),
)
def test_passes_of_dirty_services_hold_what_a_full_render_holds(steps, family):
    records, store, kernel = base_records(), {}, Kernel()
    table = None
    for batch in steps:
        for event in batch:
            apply_event(records, store, event)
        held = [
            ip
            for key, value in store.items()
            if key.startswith(SERVICES)
            for ip in ServiceRecord.from_bytes(key, value).cluster_ips
        ]
        # the settings hold an IPv4 CIDR only: IPv6 is wanted once a Service has an IPv6 VIP
        assert records.wants(family) == (family == 4 or any(":" in ip for ip in held))
        plan = calc_plan(records, "n1", family, LOCAL, table, records.take_dirty())
        if plan is None:
            continue
        assert_batch_is_the_script(plan)
        kernel.run(plan.script, plan.full)
        table = table or ServiceTable(family)
        table.commit(plan)
        fresh = base_records()
        for key, value in store.items():
            fresh.apply(kv(key, value))
        # a full render with the table as hints (a resync): ClientIP slots where they are
        full = calc_plan(fresh, "n1", family, LOCAL, None, set(), (), table.services)
        whole = ServiceTable(family)
        if full is not None:  # else nothing of the family is wanted any more
            whole.commit(full)
        assert rendered(table) == rendered(whole) == kernel.elements
        # the same full render sending its skeleton and affinity chains first: the same
        # commands, split otherwise, and the same table
        sent = SentEarly()
        early = calc_plan(fresh, "n1", family, LOCAL, None, set(), (), table.services, early=sent)
        assert (early is None) == (full is None)
        if full is not None and early is not None:
            assert sorted(early.script.splitlines()) == sorted(full.script.splitlines())
            assert early.steps is not None and sent.scripts == [early.steps.early]
            assert "add table" in early.steps.early and "add table" not in early.steps.declarations
            assert early.started is not None
            affinity = {c for c in calc_shape_chains(whole.shape_counts) if "sticky-" in c}
            t = f"ip{'6' if family == 6 else ''} {TABLE}"
            assert all(f"add chain {t} {c}\n" in sent.scripts[0] for c in affinity)
            again = ServiceTable(family)
            again.commit(early)
            assert rendered(again) == rendered(whole)
        assert set(table.shape_counts) == set(whole.shape_counts)
        assert table.port_count == whole.port_count
        # the names index the updates keep is the whole table's, and the chains the kernel holds
        assert table.name_users == whole.name_users
        assert table.chains() == calc_shape_chains(whole.shape_counts)
        assert {c for c in kernel.chains if is_shape_chain(c)} <= table.chains()


def test_two_services_on_one_vip_port_program_one_then_the_other_and_never_a_duplicate_key():
    records, table = base_records(), ServiceTable(4)
    first = ServiceRecord(
        "ns",
        "a",
        "ClusterIP",
        (ServicePort("http", "TCP", 80, 8080),),
        ("10.96.0.9",),
        (),
        {"app": "a"},
    )
    second = ServiceRecord(
        "ns",
        "b",
        "ClusterIP",
        (ServicePort("http", "TCP", 80, 9090),),
        ("10.96.0.9",),
        (),
        {"app": "a"},
    )
    for record in (first, second):
        records.apply(kv(record.key, record.to_bytes()))
    plan = calc_plan(records, "n1", 4, LOCAL, None, records.take_dirty())
    table.commit(plan)
    assert list(table.services) == [first.key]
    assert plan.script.count("10.96.0.9 . tcp . 80 :") == 1
    assert table.left_out == {second.key}
    records.apply(kv(first.key, b""), deleted=True)
    table.commit(calc_plan(records, "n1", 4, LOCAL, table, records.take_dirty()))
    assert list(table.services) == [second.key]  # retried in the pass that freed its entry
    assert not table.left_out


def affinity_records(vip_a: str, vip_b: str) -> tuple[Records, list[ServiceRecord]]:
    """Services a and b under ClientIP affinity on ``vip_a`` and ``vip_b`` port 80, and the
    one endpoint both select."""
    records = base_records()
    services = [
        ServiceRecord(
            "ns",
            name,
            "ClusterIP",
            (ServicePort("http", "TCP", 80, 8080),),
            (vip,),
            (),
            {"app": "a"},
            session_affinity="ClientIP",
        )
        for name, vip in (("a", vip_a), ("b", vip_b))
    ]
    endpoint = EndpointRecord("ns", "x", "eth0", ("10.0.0.2",), {"app": "a"}, "n2", {})
    for record in (*services, endpoint):
        records.apply(kv(record.key, record.to_bytes()))
    return records, services


class SentEarly:
    """An ``early`` for ``calc_plan``: the scripts it was given, each taken at once."""

    def __init__(self) -> None:
        self.scripts: list[str] = []

    def __call__(self, script: str) -> Started:
        self.scripts.append(script)
        return Started(None, [])


def test_an_affinity_chain_sent_early_whose_service_is_left_out_is_deleted_after():
    """Two Services under affinity on one VIP port: both chains go early, before the plan
    knows the second is left out; the full render's deletes then remove its chain."""
    records, services = affinity_records("10.96.0.9", "10.96.0.9")
    sent = SentEarly()
    plan = calc_plan(records, "n1", 4, LOCAL, None, records.take_dirty(), early=sent)
    table = ServiceTable(4)
    table.commit(plan)
    assert table.left_out == {services[1].key}
    (kept,) = [c for c in table.chains() if "sticky-" in c]
    chains = [
        line.split()[4]
        for line in sent.scripts[0].splitlines()
        if line.startswith("add chain") and "sticky-" in line
    ]
    (gone,) = [c for c in chains if c != kept]
    assert plan.steps is not None and f"delete chain ip {TABLE} {gone}\n" in plan.steps.deletes
    assert kept not in plan.steps.deletes


class RecordingNft:
    """What ``run_plan`` asked of the nft engine."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def run(self, script: str) -> None:
        self.calls.append("run")

    def run_apart(self, script: str) -> None:
        self.calls.append("run_apart")

    def run_elements(self, batch) -> None:
        self.calls.append("run_elements")

    def run_then_elements(self, script: str, make, beside=None) -> None:
        self.calls.append("run_then_elements")
        make()
        if beside is not None:
            beside()


def test_two_affinity_chains_of_one_key_program_one_service_not_a_refused_transaction(
    monkeypatch,
):
    """Two chains whose ``sticky-backends`` keys collide (made so here: a 64-bit digest) would
    give one key two endpoints: the second Service is left out, as one whose VIP is taken."""
    monkeypatch.setattr("services.proxy.elements.calc_chain_key", lambda chain: 7 << 32 | 9)
    (records, services), table = affinity_records("10.96.0.9", "10.96.0.10"), ServiceTable(4)
    plan = calc_plan(records, "n1", 4, LOCAL, None, records.take_dirty())
    table.commit(plan)
    assert list(table.services) == [services[0].key]
    assert table.left_out == {services[1].key}
    assert plan.script.count("7 . 9 . 0 : 10.0.0.2 . 8080") == 1


def test_a_full_render_runs_its_declarations_then_one_element_batch_and_so_does_an_update():
    records, table, nft = base_records(), ServiceTable(4), RecordingNft()
    port = ServicePort("http", "TCP", 80, 8080)
    service = ServiceRecord("ns", "a", "ClusterIP", (port,), ("10.96.0.9",), (), {"app": "a"})
    records.apply(kv(service.key, service.to_bytes()))
    for pod, ip in (("x", "10.0.0.2"), ("y", "10.0.0.3")):
        endpoint = EndpointRecord("ns", pod, "eth0", (ip,), {"app": "a"}, "n2", {})
        records.apply(kv(endpoint.key, endpoint.to_bytes()))
    full = calc_plan(records, "n1", 4, LOCAL, None, records.take_dirty())
    run_plan(nft, full)  # type: ignore[arg-type]
    table.commit(full)
    moved = EndpointRecord("ns", "y", "eth0", ("10.0.0.13",), {"app": "a"}, "n2", {})
    records.apply(kv(moved.key, moved.to_bytes()))
    update = calc_plan(records, "n1", 4, LOCAL, table, records.take_dirty())
    run_plan(nft, update)  # type: ignore[arg-type]
    assert update.elements is not None and update.elements.changes
    # the full render: its declarations then every element, no deletes; the update: a batch
    assert nft.calls == ["run_then_elements", "run_elements"]
    assert full.steps is not None and not full.steps.deletes
