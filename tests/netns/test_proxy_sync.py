"""The incremental proxy against a real kernel: what pycnid's passes leave in nftables.

tests/unit/test_proxy_table.py proves the ServiceTable's passes equal a full render on a
model of the kernel; here the kernel is real. (1) Runs of generated ProxyModels go, one
after another, through ONE kept libnftables context in netns A (as pycnid keeps one) with a
ServiceTable, run as pycnid runs them (``run_plan``: a full render's declarations, element
batch and deletes; an update's batch or script), and after each step A's table is listed
against netns B, where the same model is rendered whole, as one script, into a fresh
table: same sets, maps, elements, chains and rules, and no shape chain that nothing jumps
to. (2) ProxySync itself, over a SQLite store, in a netns:
a restart with fewer Services deletes the previous run's shape chains and leaves a foreign
table alone; a table changed by hand is whole again after the next refused transaction or
resync. End states only: every wait is a poll with a generous timeout.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.nftelem import ElementBatch
from nodes.record import NodeRecord, node_key
from services.ops.trace import trace
from services.proxy.config import ProxyConfig
from services.proxy.inputs import ProxyInputs
from services.proxy.model import PROTOCOLS, ProxyModel, ProxyPort, ProxyService, ServicePortView
from services.proxy.render import FAMILY, TABLE, is_shape_chain
from services.proxy.sync import POLL, calc_plan, run_plan
from services.proxy.table import ServiceTable, group_views
from services.proxy.view import PREFIXES, Records
from services.record import EndpointRecord, ServicePort, ServiceRecord, ServiceSettings
from store.base import Delete, Put
from store.codec import encode
from store.keys import SERVICES_META, pool_key, proxy_inputs_key
from store.sqlite import SqliteStore
from tests.fixtures.netns import Netns, new_netns
from tests.fixtures.svc_model import NODE, NODE6, be
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.netns
ROOT = Path(__file__).resolve().parents[2]
KEPT_CONTEXT = """
import json, sys
from kernel.nft import Nft, NftError
from kernel.nftelem import ElementBatch, ElementChange, SetType
nft = Nft()
print(json.dumps(nft.engine), flush=True)
for line in sys.stdin:
    kind, arg = json.loads(line)
    try:
        if kind == "batch":
            family, table, changes = arg
            nft.run_elements(ElementBatch(family, table, tuple(
                ElementChange(verb, name, SetType(tuple(key), data and tuple(data)),
                              tuple(map(tuple, elements)))
                for verb, name, key, data, elements in changes)))
        else:
            nft.run(arg)
        print("null", flush=True)
    except NftError as exc:
        print(json.dumps(str(exc)), flush=True)
"""
DROP_TABLES = "".join(f"add table {f} {TABLE}\ndelete table {f} {TABLE}\n" for f in ("ip", "ip6"))


class KeptContext:
    """One libnftables context made inside a netns (a process living there), fed scripts."""

    def __init__(self, ns: Netns) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns.name, sys.executable, "-c", KEPT_CONTEXT],
            cwd=ROOT,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.engine = json.loads(self.proc.stdout.readline())

    def run(self, script: str) -> str | None:
        """nft's refusal, or None when the transaction went in."""
        return self._ask("script", script)

    def run_elements(self, batch: ElementBatch) -> None:
        """``Nft.run_elements`` in the netns; a refusal fails the test."""
        changes = [[c.verb, c.set, c.type.key, c.type.data, c.elements] for c in batch.changes]
        refused = self._ask("batch", [batch.family, batch.table, changes])
        assert refused is None, refused

    def as_nft(self) -> KeptNft:
        return KeptNft(self)

    def _ask(self, kind: str, arg: object) -> str | None:
        self.proc.stdin.write(json.dumps([kind, arg]) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


class KeptNft:
    """The kept context with ``Nft``'s contract, for ``run_plan``: a refusal fails the test
    (as pycnid's would raise); ``run_apart`` is the same libnftables in another place."""

    def __init__(self, ctx: KeptContext) -> None:
        self.ctx = ctx

    def run(self, script: str) -> None:
        refused = self.ctx.run(script)
        assert refused is None, refused

    run_apart = run

    def run_elements(self, batch: ElementBatch) -> None:
        self.ctx.run_elements(batch)

    def run_then_elements(self, script: str, make, beside=None) -> None:
        self.run(script)
        self.run_elements(make())
        if beside is not None:
            beside()


@pytest.fixture(scope="module")
def kept() -> Iterator[tuple[KeptContext, Netns, Netns]]:
    """Module-scoped (hypothesis runs every example in one test call): netns A with its
    kept context, netns B for whole renders; each example drops both tables first."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    a, b = new_netns("proxya"), new_netns("proxyb")
    ctx = KeptContext(a)
    try:
        yield ctx, a, b
    finally:
        ctx.close()
        a.delete()
        b.delete()


def calc_listing(ns: Netns, family: int) -> dict[str, Any]:
    """The table as comparable data: objects without handles, elements normalized and
    sorted, each chain's declaration and rules in order; {} when there is no table."""
    proc = ns.run(["nft", "-j", "list", "table", FAMILY[family], TABLE], check=False)
    if proc.returncode:
        return {}
    out: dict[str, Any] = {}
    for item in json.loads(proc.stdout)["nftables"]:
        ((kind, body),) = item.items()
        body = {k: v for k, v in body.items() if k != "handle"}
        if kind in ("set", "map"):
            elem = sorted(json.dumps(e, sort_keys=True) for e in body.pop("elem", []))
            out[f"{kind} {body['name']}"] = (body, elem)
        elif kind == "chain":
            out.setdefault(f"chain {body['name']}", {"rules": []})["decl"] = body
        elif kind == "rule":
            out.setdefault(f"chain {body['chain']}", {"rules": []})["rules"].append(body)
    return out


def calc_targets(doc: Any) -> set[str]:
    """Every chain a verdict (in a rule or a map element) jumps or goes to."""
    if isinstance(doc, str) and doc[:1] in "[{":
        return calc_targets(json.loads(doc))  # an element, normalized by calc_listing
    if isinstance(doc, (list, tuple)):
        return set().union(*map(calc_targets, doc)) if doc else set()
    if not isinstance(doc, dict):
        return set()
    found = {v["target"] for k, v in doc.items() if k in ("jump", "goto") and isinstance(v, dict)}
    return found.union(*map(calc_targets, doc.values()))


def calc_referenced(listing: dict[str, Any]) -> set[str]:
    """The sets and maps a rule names (``@name``)."""
    return set(re.findall(r'"@([\w-]+)"', json.dumps(listing)))


def calc_unused_shape_chains(listing: dict[str, Any]) -> set[str]:
    chains = {key.split(" ", 1)[1] for key in listing if key.startswith("chain ")}
    used = calc_targets(list(listing.values()))
    return {c for c in chains if is_shape_chain(c) and c not in used}


INDEX_OBJECT = re.compile(r"^(set sticky|map (np-)?slot)-\d+$|^set clients-|^chain sticky-")


def addresses(family: int, base: str) -> st.SearchStrategy:
    fmt = (lambda i: f"{base}{i}") if family == 4 else (lambda i: f"{base}{i:x}")
    return st.integers(2, 40).map(lambda i: ipaddress.ip_address(fmt(i)))


@st.composite
def models(draw, family: int) -> ProxyModel:
    """Like test_svc_render.models, for both families: every protocol, several ports per
    Service, affinity, NodePorts, externalIPs, Local policies, empty Services, node
    addresses that change (a NodePort's addresses are re-planned for every Service)."""
    v4 = family == 4
    vip, ext = ("10.96.0.", "192.168.99.") if v4 else ("fd96::", "fd99::")
    node = NODE if v4 else NODE6
    node = replace(
        node,
        node_ips=draw(
            st.sampled_from(
                [
                    node.node_ips,
                    node.node_ips + (ipaddress.ip_address("192.168.0.3" if v4 else "fd01::3"),),
                ]
            )
        ),
    )
    backends = st.lists(
        st.builds(
            lambda ip, local: be(str(ip), 8080, local),
            addresses(family, "10.0.0." if v4 else "fd00::"),
            st.booleans(),
        ),
        max_size=5,
        unique_by=lambda b: b.ip,
    )
    views = []
    for i in sorted(draw(st.sets(st.integers(1, 6), max_size=4))):
        protos = draw(st.lists(st.sampled_from(PROTOCOLS), min_size=1, max_size=2, unique=True))
        ports = tuple(
            ProxyPort(f"p{j}", p, 80 + j, draw(st.sampled_from([None, 30000 + 10 * i + j])))
            for j, p in enumerate(protos)
        )
        svc = ProxyService(
            "ns",
            f"s{i}",
            (ipaddress.ip_address(f"{vip}{i}"),),
            draw(st.sampled_from([(), (ipaddress.ip_address(f"{ext}{i}"),)])),
            ports,
            draw(st.sampled_from([None, 10, 10800])),
            draw(st.booleans()),
            draw(st.booleans()),
        )
        views += [ServicePortView(svc, port, tuple(draw(backends))) for port in ports]
    return ProxyModel(family, node, tuple(views))


RUNS = st.sampled_from([4, 6]).flatmap(lambda f: st.lists(models(f), min_size=2, max_size=5))


def calc_step(table: ServiceTable | None, model: ProxyModel):
    """What pycnid plans for one step: a full render first, then every Service of the new
    model plus those gone from it (``()``), as view.calc_changes hands them over."""
    changes = group_views(model.ports)
    if table is None:
        return ServiceTable(model.family).plan(model.node, changes, full=True)
    gone = {key: () for key in table.services if key not in changes}
    return table.plan(model.node, {**gone, **changes})


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(run=RUNS)
def test_passes_through_a_kept_context_hold_what_a_fresh_render_holds(kept, run):
    ctx, a, b = kept
    assert ctx.engine == "libnftables"
    assert ctx.run(DROP_TABLES) is None
    table: ServiceTable | None = None
    for step, model in enumerate(run):
        plan = calc_step(table, model)
        run_plan(ctx.as_nft(), plan)  # type: ignore[arg-type]  # a full render in three steps
        table = table or ServiceTable(model.family)
        table.commit(plan)
        whole = ServiceTable(model.family).plan(
            model.node, group_views(model.ports), full=True, hints=table.services
        )  # a resync's render
        b.run(["nft", "-f", "-"], input=DROP_TABLES + whole.script)
        listed, fresh = calc_listing(a, model.family), calc_listing(b, model.family)
        assert listed == fresh, step
        assert not calc_unused_shape_chains(listed), step


def test_a_gone_affinity_port_takes_its_chain_and_sets_with_it(kept):
    ctx, a, _b = kept
    assert ctx.run(DROP_TABLES) is None
    port = ProxyPort("p", "tcp", 80)
    sticky = ProxyService(
        "ns", "s1", (ipaddress.ip_address("10.96.0.1"),), ports=(port,), affinity_timeout=10
    )
    table = None
    for views in ((ServicePortView(sticky, port, (be("10.0.0.2"), be("10.0.0.3"))),), ()):
        plan = calc_step(table, ProxyModel(4, NODE, views))
        assert ctx.run(plan.script) is None
        table = table or ServiceTable(4)
        table.commit(plan)
    assert not {k for k in calc_listing(a, 4) if INDEX_OBJECT.match(k)}


PROXY = """
import json, sys, time
from services.proxy.sync import ProxySync
from common.metrics import Registry
from store.sqlite import SqliteStore
sync = ProxySync("n1", SqliteStore(sys.argv[1]), Registry(), float(sys.argv[2])).start()
for line in sys.stdin:
    if line.strip() == "wake":  # what an etcd watch does on a change (SQLite has none)
        sync.wake.set()
    if line.strip() == "synced":  # the first pass went in (or a minute went by)
        deadline = time.monotonic() + 60
        while not sync.metrics.syncs.value() and time.monotonic() < deadline:
            time.sleep(0.05)
    print(json.dumps({"syncs": sync.metrics.syncs.value(),
                      "failures": sync.metrics.failures.value()}), flush=True)
sync.stop()
"""
LOCAL = "192.168.0.2"


class Proxy:
    """pycnid's ProxySync (as services/proxy/setup.py starts it) in a process inside ``ns``."""

    def __init__(self, ns: Netns, db: Path, resync: float) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns.name, sys.executable, "-c", PROXY, str(db), str(resync)],
            cwd=ROOT,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def ask(self, command: str) -> dict[str, float]:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0
        self.proc.stdout.close()


def svc_record(name: str, vip: str, **kw: Any) -> ServiceRecord:
    return ServiceRecord(
        "ns",
        name,
        "ClusterIP",
        (ServicePort("http", "TCP", 80, 8080),),
        (vip,),
        (),
        {"app": name},
        **kw,
    )


def pod_record(i: int, app: str) -> EndpointRecord:
    return EndpointRecord("ns", f"p{i}", "eth0", (f"10.0.0.{i + 2}",), {"app": app}, "n1")


def ensure_records(store: SqliteStore, puts: list[Any], deletes: list[str] = ()) -> None:
    store.txn([], [*(Put(r.key, r.to_bytes()) for r in puts), *(Delete(k) for k in deletes)])


def setup_store(db: Path) -> SqliteStore:
    store = SqliteStore(str(db))
    store.txn(
        [],
        [
            Put(SERVICES_META, ServiceSettings(("10.96.0.0/16",)).to_bytes()),
            Put(pool_key("pods"), encode({"cidr": "10.0.0.0/16"})),
        ],
    )
    return store


def calc_expected(store: SqliteStore, fresh: Netns) -> dict[str, Any]:
    """What a fresh full render of the store's records holds (rendered in ``fresh``)."""
    records = Records()
    for prefix in PREFIXES:
        records.replace_all(store.range(prefix), prefix)
    plan = calc_plan(records, "n1", 4, [LOCAL], None, set())
    fresh.run(["nft", "-f", "-"], input=DROP_TABLES + plan.script)
    return calc_listing(fresh, 4)


def calc_chains(listing: dict[str, Any]) -> set[str]:
    return {key.split(" ", 1)[1] for key in listing if key.startswith("chain ")}


@pytest.fixture
def node_ns(netns_factory) -> Netns:
    ns = netns_factory("proxynode")
    ns.run(
        f"ip link add v0 type veth peer name v1 && ip addr add {LOCAL}/24 dev v0 && "
        "ip link set v1 up && ip link set v0 up"
    )
    return ns


EARLIER_LAYOUT = """table ip pycni-svc {
  set sticky-0 { type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags dynamic,timeout; }
  map slot-0 { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; }
  chain pick-10-0 { update @sticky-0 { ip saddr . ip daddr . meta l4proto . th dport timeout 10s }
    dnat ip to ip daddr . meta l4proto . th dport map @slot-0; }
  chain aff-10-1 { numgen random mod 1 vmap { 0 : goto pick-10-0 }; }
  set clients-ABCDEFGHIJ { type ipv4_addr; flags dynamic,timeout; }
  chain sticky-KLMNOPQRST-default/sticky/tcp/80 { ip saddr @clients-ABCDEFGHIJ
    update @clients-ABCDEFGHIJ { ip saddr timeout 10s } meta l4proto tcp dnat ip to 10.0.0.2:80; }
}
"""
FOREIGN = """table ip foreign {
  chain lb-4 { }
  chain aff-10-3 { }
  chain nat-output { type nat hook output priority -100; policy accept; jump lb-4; }
}
"""


@pytest.fixture
def restarted(node_ns, netns_factory, tmp_path) -> dict[str, Any]:
    """Run 1, over what pycnids of the earlier affinity layouts left (aff-T-N, pick-T-i,
    sticky-i, slot-i; a sticky- chain with a clients- set per endpoint): a ClientIP Service
    of three endpoints (its sticky- chain, their keys in the clients set) and one of four
    (lb-4). Run 2, after a restart: the first gone, the
    second down to two (lb-2)."""
    node_ns.run(["nft", "-f", "-"], input=FOREIGN + EARLIER_LAYOUT)
    foreign = node_ns.run(["nft", "-j", "list", "table", "ip", "foreign"]).stdout
    store = setup_store(tmp_path / "store.db")
    ensure_records(
        store,
        [
            svc_record("sticky", "10.96.0.5", session_affinity="ClientIP", timeout_seconds=10),
            svc_record("four", "10.96.0.6"),
            *(pod_record(i, "sticky") for i in range(3)),
            *(pod_record(i, "four") for i in range(3, 7)),
        ],
    )
    listings = []
    for _run in range(2):
        proxy = Proxy(node_ns, tmp_path / "store.db", 60)
        assert proxy.ask("synced")["syncs"] >= 1
        proxy.stop()
        listings.append(calc_listing(node_ns, 4))
        ensure_records(
            store, [pod_record(i, "other") for i in range(3, 5)], [svc_record("sticky", "").key]
        )
    return {
        "runs": listings,
        "fresh": calc_expected(store, netns_factory("proxyfresh")),
        "foreign": (foreign, node_ns.run(["nft", "-j", "list", "table", "ip", "foreign"]).stdout),
    }


def test_a_restart_deletes_the_shape_chains_the_last_run_left(restarted):
    first, second = restarted["runs"]
    sticky = {c for c in calc_chains(first) if c.startswith("sticky-")}
    assert len(sticky) == 1 and "lb-4" in calc_chains(first)
    assert "set clients" in first and not [k for k in first if k.startswith("set clients-")]
    assert "chain sticky-KLMNOPQRST-default/sticky/tcp/80" not in first
    assert not {"chain aff-10-1", "chain pick-10-0", "set sticky-0", "map slot-0"} & set(first)
    assert not (sticky | {"lb-4"}) & calc_chains(second)
    assert "lb-2" in calc_chains(second) and not calc_unused_shape_chains(second)
    assert second == restarted["fresh"]  # no affinity chain of the last run
    before, after = restarted["foreign"]
    assert json.loads(before)["nftables"][1:] == json.loads(after)["nftables"][1:]


def calc_whole(ns: Netns, fresh: dict[str, Any]) -> bool:
    return calc_listing(ns, 4) == fresh


EDITS = {
    "table-deleted": (f"delete table ip {TABLE}", 600),
    "map-flushed": (f"flush map ip {TABLE} service-ips", 2),
    "element-deleted": (
        f"delete element ip {TABLE} backends-tcp {{ 10.96.0.6 . tcp . 80 . 0 }}",
        2,
    ),
}


@pytest.mark.parametrize("edit", EDITS)
def test_a_table_changed_by_hand_is_whole_again(node_ns, netns_factory, tmp_path, edit):
    """While the proxy runs: the hand edit, then a Service change and a wake (an etcd watch's).
    A gone table refuses the change's pass and the retry renders it whole (no resync due for
    600 s: the refusal alone heals it); a flushed map or a deleted element does not refuse
    the pass, and the next resync (every 2 s) refills it. Either way the end state is the
    store's whole render."""
    script, resync = EDITS[edit]
    store, fresh_ns = setup_store(tmp_path / "store.db"), netns_factory("proxyfresh")
    ensure_records(
        store, [svc_record("four", "10.96.0.6"), *(pod_record(i, "four") for i in range(4))]
    )
    proxy = Proxy(node_ns, tmp_path / "store.db", resync)
    try:
        assert proxy.ask("synced")["syncs"] >= 1
        fresh = calc_expected(store, fresh_ns)
        wait_for("the first render", lambda: calc_whole(node_ns, fresh), timeout=30)
        node_ns.run(["nft", script])
        assert not calc_whole(node_ns, fresh)
        ensure_records(store, [svc_record("late", "10.96.0.7"), pod_record(9, "late")])
        proxy.ask("wake")
        fresh = calc_expected(store, fresh_ns)
        wait_for("the whole table again", lambda: calc_whole(node_ns, fresh), timeout=60)
        if edit == "table-deleted":
            assert proxy.ask("metrics")["failures"] >= 1
    finally:
        proxy.stop()


def test_a_sqlite_store_change_is_programmed_without_a_watch(node_ns, netns_factory, tmp_path):
    """SQLite has no watch: the proxy looks at the store's revision every POLL seconds and
    re-reads only when it moved, so a new Service is programmed without a wake and long
    before the next resync (600 s here)."""
    store, fresh_ns = setup_store(tmp_path / "store.db"), netns_factory("proxyfresh")
    ensure_records(store, [svc_record("four", "10.96.0.6"), pod_record(0, "four")])
    store.txn([], [Put(node_key("n1"), NodeRecord("n1", LOCAL).to_bytes())])
    proxy = Proxy(node_ns, tmp_path / "store.db", 600)
    try:
        assert proxy.ask("synced")["syncs"] >= 1
        ensure_records(store, [svc_record("late", "10.96.0.7"), pod_record(9, "late")])
        fresh = calc_expected(store, fresh_ns)
        wait_for("the new Service without a wake", lambda: calc_whole(node_ns, fresh), timeout=15)
        synced = proxy.ask("metrics")["syncs"]
        time.sleep(3 * POLL)  # an unchanged store: no pass
        assert proxy.ask("metrics")["syncs"] == synced
    finally:
        proxy.stop()


def read_published(store: SqliteStore) -> ProxyInputs | None:
    kv = store.get(proxy_inputs_key("n1"))
    return ProxyInputs.from_bytes(kv.key, kv.value) if kv else None


def test_the_proxy_publishes_the_addresses_it_programs_from_when_they_change(node_ns, tmp_path):
    """What `pycni svc trace --node n1` reads on another node: after the first pass the
    node's global addresses and settings; an address added to the node is published again
    (SQLite: the next poll's pass), and is then a NodePort address of n1's trace."""
    store = setup_store(tmp_path / "store.db")
    ensure_records(store, [svc_record("four", "10.96.0.6"), pod_record(0, "four")])
    store.txn([], [Put(node_key("n1"), NodeRecord("n1", LOCAL).to_bytes())])
    proxy = Proxy(node_ns, tmp_path / "store.db", 600)
    try:
        assert proxy.ask("synced")["syncs"] >= 1
        wait_for("the first inputs", lambda: read_published(store) is not None, timeout=10)
        first = read_published(store)
        assert first is not None and first.addresses == (LOCAL,)
        assert first.config == ProxyConfig() and first.at > 0
        node_ns.run("ip addr add 192.168.7.2/24 dev v0")
        wait_for(
            "the added address published",
            lambda: "192.168.7.2" in getattr(read_published(store), "addresses", ()),
            timeout=10,
        )
        doc = trace(store, "n1", "203.0.113.9", "10.96.0.6:80/tcp")
        assert doc["inputs"]["source"] == "published"
        assert set(doc["nodeIPs"]) == {LOCAL, "192.168.7.2"}
    finally:
        proxy.stop()
