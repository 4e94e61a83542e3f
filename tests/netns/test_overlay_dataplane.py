"""The overlay's reconciler against a real kernel, over generated runs: whatever desired state
follows whatever was programmed before (peers joining, leaving, changing VTEP MAC, underlay
address or gateway), one ``apply_diff`` makes the kernel hold exactly the desired entries with
pycni's marks, and the entries someone else made (a static route, a hand-made neighbour and FDB
entry and proxy entry) are never touched. FDB entries carry no protocol: pycni's are those whose
MAC it wants, its neighbours name, or it programmed before (the sync remembers them)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroute2 import IPRoute

from kernel.ns import entered
from kernel.vxlan import VxlanSpec, ensure_vxlan
from overlay.dataplane import apply_diff, read_actual
from overlay.model import Entries, FdbEntry, NeighEntry, ProxyEntry, RouteEntry

pytestmark = pytest.mark.netns
MACS = ["66:00:00:00:00:01", "66:00:00:00:00:02", "66:00:00:00:00:03"]
UNDERLAYS = ["192.168.78.2", "192.168.78.3", "192.168.78.4"]
VTEPS = ["10.50.9.1", "10.50.9.2", "fd50::9:1"]
BLOCKS = ["10.50.0.0/26", "10.50.0.64/26", "10.50.1.0/26", "fd50::/122", "10.50.7.7/32"]
FOREIGN = {
    "route": "10.99.0.0/24 via 192.168.78.9",
    "neigh": "10.50.9.99",
    "fdb": "66:00:00:00:00:99",
    "proxy": "fd50::99",
}


@pytest.fixture(scope="module")
def kernel():
    """A netns with an underlay veth, a bridge and pycni's VXLAN device, plus entries someone
    else made; the IPRoute bound to it and the two device indexes."""
    name = f"pycnidp{os.getpid() % 100000}"
    os.system(f"ip netns add {name}")
    try:
        run = lambda cmd: os.system(f"ip netns exec {name} sh -c '{cmd}'")  # noqa: E731
        run(
            "ip link add u0 type veth peer name u1 && ip link set u0 up && ip link set u1 up"
            " && ip addr add 192.168.78.1/24 dev u0 && ip link add br0 type bridge"
            " && ip link set br0 up"
        )
        fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
        with entered(fd):
            ipr = IPRoute()
        os.close(fd)
        vx, _ = ensure_vxlan(
            ipr,
            VxlanSpec(
                "pycni.1", 1, 4789, "192.168.78.1", ipr.link_lookup(ifname="u0")[0], MACS[0], 1450
            ),
        )
        run(
            f"ip route add {FOREIGN['route']} proto static && ip neigh add {FOREIGN['neigh']}"
            f" lladdr {FOREIGN['fdb']} dev pycni.1 nud permanent && bridge fdb append"
            f" {FOREIGN['fdb']} dev pycni.1 dst 192.168.78.9 self permanent"
            f" && ip -6 neigh add proxy {FOREIGN['proxy']} dev br0"
        )
        yield ipr, vx.index, ipr.link_lookup(ifname="br0")[0], name
        ipr.close()
    finally:
        os.system(f"ip netns del {name}")


def entries(vx: int, br: int):
    route = st.builds(
        lambda dst, via, dev: RouteEntry(
            dst, via if dev == "vx" else None, vx if dev == "vx" else br, dev == "vx"
        ),
        st.sampled_from(BLOCKS),
        st.sampled_from(VTEPS[:2]),
        st.sampled_from(["vx", "br"]),
    )
    neigh = st.builds(
        lambda ip, mac: NeighEntry(vx, ip, mac), st.sampled_from(VTEPS), st.sampled_from(MACS)
    )
    fdb = st.builds(
        lambda mac, dst: FdbEntry(vx, mac, dst), st.sampled_from(MACS), st.sampled_from(UNDERLAYS)
    )
    proxy = st.builds(lambda ip: ProxyEntry(br, ip), st.sampled_from(["fd50::5", "fd50::6"]))
    return st.builds(
        lambda r, n, f, p: Entries(
            frozenset(fix_routes(r)),
            frozenset(one_per_key(n)),
            frozenset(one_per_key(f, by_mac=True)),
            frozenset(p),
        ),
        st.lists(route, max_size=5),
        st.lists(neigh, max_size=3),
        st.lists(fdb, max_size=3),
        st.lists(proxy, max_size=2),
    )


def fix_routes(routes: list[RouteEntry]) -> list[RouteEntry]:
    """One route per destination, of its family's gateway (the model never makes two)."""
    out: dict[str, RouteEntry] = {}
    for r in routes:
        six = ":" in r.dst
        via = r.via and ("fd50::9:1" if six else r.via)
        out[r.dst] = RouteEntry(r.dst, via, r.oif, r.onlink)
    return list(out.values())


def one_per_key(items: list, by_mac: bool = False) -> list:
    out = {}
    for item in items:
        out[item.mac if by_mac else item.ip] = item
    return list(out.values())


def foreign_state(name: str) -> tuple:
    def show(cmd: str) -> list:
        out = subprocess.run(
            ["ip", "netns", "exec", name, *cmd.split()], capture_output=True, text=True, check=True
        ).stdout
        return json.loads(out or "[]")

    routes = [r for r in show("ip -j route") if r.get("protocol") == "static"]
    neighs = [n for n in show("ip -j neigh show dev pycni.1") if n.get("dst") == FOREIGN["neigh"]]
    fdbs = [f for f in show("bridge -j fdb show dev pycni.1") if f.get("mac") == FOREIGN["fdb"]]
    proxies = [p for p in show("ip -j -6 neigh show proxy") if p.get("dst") == FOREIGN["proxy"]]
    return routes, neighs, fdbs, proxies


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_any_run_of_desired_states_is_programmed_exactly_and_foreign_entries_stay(kernel, data):
    ipr, vx, br, name = kernel
    before, macs = foreign_state(name), set()  # macs: what the sync remembers programming
    for desired in data.draw(st.lists(entries(vx, br), min_size=1, max_size=4)):
        macs |= {f.mac for f in desired.fdbs}
        outcome = apply_diff(ipr, desired, read_actual(ipr, vx, macs))
        assert outcome.failed == []
        assert read_actual(ipr, vx, macs) == desired
    assert foreign_state(name) == before
    apply_diff(ipr, Entries(), read_actual(ipr, vx, macs))  # the next example starts clean
    assert read_actual(ipr, vx, macs) == Entries()
