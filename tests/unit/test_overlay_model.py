"""The overlay's pure parts, over generated input: the desired state (every entry has a reason,
each peer's entries point at that peer, order of peers never matters), the registry (applying
watch events one by one gives the same peers as reading the final store contents at once), the
node record codec and the daemon's ``overlay`` section (a value or a code-7 error, nothing else).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.spec.errors import InvalidConfig
from cni.spec.request import Env, Request
from ipam.records import BlockRecord
from nodes.record import NodeRecord, OverlayInfo, node_key
from overlay.config import OverlayConfig, calc_vtep_mac, parse_overlay_config
from overlay.firewall import render_table
from overlay.model import Local, Peer, RouteEntry, calc_desired, host_net
from overlay.registry import Registry
from plugins.bridge.config import parse_bridge_config
from plugins.bridge.overlay import fit_to_node
from store.base import KV
from store.codec import CorruptRecord
from store.keys import affinity_key, block_key

NODES = [f"n{i}" for i in range(5)]
BLOCKS = [f"10.40.{i}.0/26" for i in range(8)] + [f"fd40::{i:x}00/120" for i in range(4)]
HOSTS = [f"10.40.{i}.{j}" for i in range(8) for j in (5, 9)]

underlays = st.sampled_from([f"172.30.0.{i}" for i in range(1, 6)])
macs = st.sampled_from(["66:00:00:00:00:01", "66:00:00:00:00:02", "66:aa:bb:cc:dd:ee"])
vteps = st.lists(
    st.sampled_from(["10.40.99.1", "10.40.99.2", "fd40::99:1"]),
    max_size=2,
    unique_by=lambda v: ipaddress.ip_address(v).version,
).map(tuple)
infos = st.builds(
    OverlayInfo,
    st.sampled_from(["vxlan", "host-gw"]),
    underlays,
    macs,
    vteps,
    st.just(1),
    st.just(4789),
    st.just(1450),
)
peers = st.lists(
    st.builds(
        Peer,
        st.sampled_from(NODES[1:]),
        infos,
        st.lists(st.sampled_from(BLOCKS), unique=True).map(tuple),
        st.lists(st.sampled_from(HOSTS), unique=True).map(tuple),
    ),
    unique_by=lambda p: p.name,
    max_size=4,
)


def local_of(backend: str, unreachable: frozenset = frozenset()) -> Local:
    return Local(
        backend,
        7,
        ("10.40.7.5",),
        lambda ip: 3 if ip.startswith("10.") else None,
        lambda ip: "via 172.30.9.1" if ip in unreachable else None,
    )


def reasons(peer: Peer) -> set[str]:
    return {str(ipaddress.ip_network(b)) for b in peer.blocks} | {host_net(h) for h in peer.hosts}


@settings(max_examples=300, deadline=None)
@given(peers, st.sampled_from(["vxlan", "host-gw"]), st.randoms())
def test_every_entry_points_at_the_peer_it_is_for(found, backend, rnd):
    local = local_of(backend)
    plan = calc_desired(local, found)
    shuffled = list(found)
    rnd.shuffle(shuffled)
    assert calc_desired(local, shuffled).entries == plan.entries
    programmed = [p for p in found if p.name not in plan.skipped]
    gateways = {
        p.name: ({p.info.underlay} if backend == "host-gw" else set(p.info.vteps))
        for p in programmed
    }
    for route in plan.entries.routes - {RouteEntry("10.40.7.5/32", None, 3)}:
        owners = [
            p.name for p in programmed if route.dst in reasons(p) and route.via in gateways[p.name]
        ]
        assert owners, f"{route} is for no programmed peer"
        assert route.oif == local.ifindex and route.onlink == (backend == "vxlan")
    assert RouteEntry("10.40.7.5/32", None, 3) in plan.entries.routes  # own borrowed address
    if backend == "host-gw":
        assert not plan.entries.neighs and not plan.entries.fdbs
    else:
        assert {f.mac for f in plan.entries.fdbs} <= {p.info.vtep_mac for p in programmed}
        assert {(n.ip, n.mac) for n in plan.entries.neighs} == {
            (v, p.info.vtep_mac) for p in programmed for v in p.info.vteps
        }
    for peer in found:
        if peer.info.backend != backend:
            assert peer.name in plan.skipped


@settings(max_examples=100, deadline=None)
@given(peers)
def test_a_host_gw_peer_off_the_connected_subnets_gets_nothing_and_is_named(found):
    far = frozenset(p.info.underlay for p in found[:1])
    plan = calc_desired(local_of("host-gw", far), found)
    for peer in found:
        if peer.info.backend == "host-gw" and peer.info.underlay in far:
            assert plan.unreachable[peer.name] == "via 172.30.9.1"
            assert not any(r.via == peer.info.underlay for r in plan.entries.routes)


@settings(max_examples=100, deadline=None)
@given(peers, st.dictionaries(underlays, st.integers(8, 12)))
def test_a_host_gw_route_leaves_on_the_device_its_peer_is_reached_on(found, devices):
    local = dataclasses.replace(local_of("host-gw"), towards=devices.get)
    own = RouteEntry("10.40.7.5/32", None, 3)
    for route in calc_desired(local, found).entries.routes - {own}:
        assert route.oif == devices.get(route.via, local.ifindex)


# -- the registry: events one by one == the final contents at once ------------------------
def node_kv(name: str, info: OverlayInfo | None) -> KV:
    return KV(node_key(name), NodeRecord(name, "x", overlay=info).to_bytes(), 1)


def block_kv(cidr: str, owner: str, borrowed: dict[str, str]) -> KV:
    record = BlockRecord("pool", cidr, owner, borrowed=borrowed)
    return KV(block_key("pool", cidr), record.to_bytes(), 1)


events = st.lists(
    st.one_of(
        st.tuples(
            st.just("node"), st.sampled_from(NODES), st.one_of(st.none(), infos), st.booleans()
        ),
        st.tuples(
            st.just("affinity"), st.sampled_from(NODES), st.sampled_from(BLOCKS[:8]), st.booleans()
        ),
        st.tuples(
            st.just("block"),
            st.sampled_from(BLOCKS[:8]),
            st.dictionaries(st.sampled_from(HOSTS), st.sampled_from(NODES), max_size=3),
            st.booleans(),
        ),
    ),
    max_size=40,
)


def as_kv(event: tuple) -> tuple[KV, bool]:
    kind, a, b, deleted = event
    if kind == "node":
        return node_kv(a, b), deleted
    if kind == "affinity":
        return KV(affinity_key(a, "pool", b), b"{}", 1), deleted
    return block_kv(a, "n0", b), deleted


@settings(max_examples=300, deadline=None)
@given(events, st.sampled_from(NODES))
def test_watch_events_applied_one_by_one_equal_a_fresh_read(found, me):
    incremental, final = Registry(), {}
    for event in found:
        kv, deleted = as_kv(event)
        incremental.apply(kv, deleted)
        if deleted:
            final.pop(kv.key, None)
        else:
            final[kv.key] = kv
    fresh = Registry()
    for prefix in ("/pycni/v1/nodes/", "/pycni/v1/affinity/", "/pycni/v1/blocks/"):
        fresh.replace_all(
            [kv for key, kv in sorted(final.items()) if key.startswith(prefix)], prefix
        )
    assert incremental.peers(me) == fresh.peers(me)
    assert incremental.hosts_of(me) == fresh.hosts_of(me)


def test_a_corrupt_node_record_is_ignored_not_fatal():
    registry = Registry()
    assert registry.apply(KV(node_key("bad"), b'{"overlay": {"backend": "ufo"}}', 1)) is False
    assert (
        registry.apply(
            node_kv(
                "good", OverlayInfo("vxlan", "172.30.0.2", "66:00:00:00:00:01", ("10.40.99.2",))
            )
        )
        is True
    )
    assert [p.name for p in registry.peers("me")] == ["good"]


@pytest.mark.parametrize(
    "field",
    [
        {"vtepMAC": "zz:zz:zz:zz:zz:zz"},
        {"vtepMAC": "01:00:5e:00:00:01"},  # multicast: an FDB entry of it floods
        {"vtepMAC": "00:00:00:00:00:00"},
        {"vtepMAC": "66:00:00:00:00"},
        {"vni": 2**24},
        {"vni": -1},
        {"port": 65536},
        {"mtu": True},
    ],
)
def test_a_node_record_a_peer_could_not_be_programmed_from_is_corrupt(field):
    overlay = {"backend": "vxlan", "underlay": "172.30.0.2", "vtepMAC": "66:00:00:00:00:01"}
    value = json.dumps({"name": "x", "overlay": {**overlay, **field}}).encode()
    with pytest.raises(CorruptRecord, match="bad overlay"):
        NodeRecord.from_bytes("/pycni/v1/nodes/x", value)


# -- codecs and config ---------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        json_values,
        st.fixed_dictionaries({"overlay": json_values}),
        st.fixed_dictionaries(
            {
                "name": st.text(max_size=5),
                "overlay": st.fixed_dictionaries(
                    {
                        "backend": st.sampled_from(["vxlan", "host-gw"]),
                        "underlay": json_values,
                        "vteps": json_values,
                        "vni": json_values,
                    }
                ),
            }
        ),
    )
)
def test_any_stored_node_record_reads_as_a_record_or_a_corrupt_record(value):
    try:
        record = NodeRecord.from_bytes("/pycni/v1/nodes/x", json.dumps(value).encode())
    except CorruptRecord:
        return
    assert NodeRecord.from_bytes("/pycni/v1/nodes/x", record.to_bytes()) == record


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"backend": st.sampled_from(["vxlan", "host-gw", "udp"])},
            optional={
                k: json_values
                for k in (
                    "underlayAddress",
                    "vni",
                    "port",
                    "device",
                    "vtepMAC",
                    "mtu",
                    "vtepPools",
                    "resyncInterval",
                    "leaveOnStop",
                )
            },
        ),
    )
)
def test_any_overlay_section_is_a_config_or_code_7(section):
    try:
        config = parse_overlay_config({"overlay": section})
    except InvalidConfig as exc:
        assert exc.code == 7 and "overlay" in exc.msg
        return
    if section is None:  # no section at all: no overlay
        assert config is None
        return
    assert isinstance(config, OverlayConfig) and config.backend in ("vxlan", "host-gw")


def test_no_overlay_section_is_a_single_node_network():
    assert parse_overlay_config({}) is None


@pytest.mark.parametrize(
    "bad,key",
    [
        ({"backend": "vxlan", "vni": 0}, "overlay.vni"),
        ({"backend": "vxlan", "port": 70000}, "overlay.port"),
        ({"backend": "vxlan", "vtepMAC": "01:00:5e:00:00:01"}, "overlay.vtepMAC"),
        ({"backend": "gre"}, "overlay.backend"),
        ({"backend": "vxlan", "mystery": 1}, "overlay.mystery"),
    ],
)
def test_a_bad_overlay_key_is_named(bad, key):
    with pytest.raises(InvalidConfig) as caught:
        parse_overlay_config({"overlay": bad})
    assert key in caught.value.msg


def test_the_vtep_mac_is_stable_unicast_and_local():
    mac = calc_vtep_mac("node1")
    assert mac == calc_vtep_mac("node1") != calc_vtep_mac("node2")
    first = int(mac[:2], 16)
    assert first & 1 == 0 and first & 2 == 2


def test_the_firewall_lists_each_peer_once_per_family():
    script = render_table("172.30.0.1", 4789, ["172.30.0.2", "172.30.0.2", "fd30::2"])
    assert "add element inet pycni-overlay peers4 { 172.30.0.2 }" in script
    assert "add element inet pycni-overlay peers6 { fd30::2 }" in script
    assert "ip daddr 172.30.0.1 udp dport 4789 notrack" in script


# -- pycni-bridge meets the node's overlay --------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        json_values,
        st.fixed_dictionaries({"type": st.sampled_from(["vxlan", "host-gw", "udp", None])}),
    ),
    st.one_of(st.none(), st.integers(60, 9100)),
    st.one_of(
        st.none(),
        st.builds(
            SimpleNamespace,
            backend=st.sampled_from(["vxlan", "host-gw"]),
            mtu=st.integers(1280, 9000),
        ),
    ),
)
def test_a_netconf_on_any_node_is_fitted_or_refused_with_code_7(backend, mtu, overlay):
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "pycni-bridge", "mtu": mtu}
    if backend is not None:
        conf["backend"] = backend
    req = Request(
        env=Env(command="ADD", container_id="c", netns="/x", ifname="eth0", args={}), config=conf
    )
    try:
        fitted = fit_to_node(parse_bridge_config(req), overlay)
    except InvalidConfig as exc:
        assert exc.code == 7 and ("backend" in exc.msg or "mtu" in exc.msg)
        return
    if overlay is not None:
        assert fitted.mtu == (mtu or overlay.mtu) and fitted.mtu <= overlay.mtu
        assert fitted.backend in (None, overlay.backend)
    else:
        assert fitted.backend is None
