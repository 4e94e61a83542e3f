"""`pycni doctor` on a real node namespace: clean with a live Pod; one of each residue made by
hand is found and named, `--repair` removes it, a second run is clean, and the live Pod keeps
its connectivity throughout. Everything is made inside the test's namespaces (pycni's tables
there, never the root namespace's)."""

from __future__ import annotations

import json
import os
import re

import pytest

from common.attachment import Attachment
from tests.fixtures.bridge import GATEWAY, NETWORK, bridge_conf, ip_of, pycni_ipam
from tests.fixtures.doctor import assert_doctor_clean, run_doctor

pytestmark = pytest.mark.netns
FREE = "10.22.0.200"  # inside the network's subnet, never handed out by these tests
GONE = "10.22.0.201"


DEPARTED_VTEP, DEPARTED_MAC = "10.99.255.1", "66:00:00:00:00:01"


def config_of(pycnid) -> str:
    """pycnid's config with an overlay section (its VXLAN device ``pycni.1``) for the doctor:
    pycnid itself runs without one (the overlay's entries are made by hand here)."""
    path = os.path.join(pycnid.workdir, "doctor.json")
    with open(path, "w") as fh:
        json.dump({**pycnid.config, "overlay": {"backend": "vxlan"}}, fh)
    return path


def make_departed_peer(node) -> None:
    """What the overlay programs for a vxlan peer (overlay/model.py), for a node with no record."""
    node.run("ip link add pycni.1 type vxlan id 1 dstport 4789 nolearning")
    node.run("ip link set pycni.1 up")
    node.run(f"ip route add 10.99.0.0/26 via {DEPARTED_VTEP} dev pycni.1 onlink proto 77")
    node.run(
        f"ip neigh add {DEPARTED_VTEP} lladdr {DEPARTED_MAC} dev pycni.1 nud permanent proto 77"
    )
    node.run(f"bridge fdb append {DEPARTED_MAC} dev pycni.1 dst 192.0.2.1")
    firewall = (
        "add table inet pycni-overlay\n"
        "add set inet pycni-overlay peers4 { type ipv4_addr; }\n"
        "add element inet pycni-overlay peers4 { 192.0.2.1 }\n"
    )
    node.run(["nft", "-f", "-"], input=firewall)


def test_a_node_with_live_pods_is_clean(bridge_node, pycnid, netns_factory):
    """A live Pod is explained; so is one of a network the doctor was not told pycni-ipam
    serves (another IPAM's, as far as it knows), veth, masquerade elements and all."""
    bridge_node.add(bridge_conf(pycni_ipam()), netns_factory("pod"))
    other = bridge_conf(pycni_ipam("10.23.0.0/24"), name="other", bridge="pycni9")
    bridge_node.add(other, netns_factory("pod"))
    code, doc = run_doctor(bridge_node.node, config_of(pycnid), "--grace=0")
    assert (code, doc["findings"], doc["networks"]) == (0, [], [NETWORK])


def make_residue(bridge_node, netns_factory) -> dict[str, str]:
    """One of each: a tagged veth with no lease, a lease whose veth is gone, a masquerade and
    a NetworkPolicy element for addresses no lease holds (and a shape chain only that element
    names), a stale table, a departed peer's
    route, neighbour, FDB entry and firewall element. Returns kind -> the object the doctor
    must name."""
    node = bridge_node.node
    node.run("ip link add vethdoc0 type veth peer name vethdoc1")
    node.run(["ip", "link", "set", "vethdoc0", "alias", f"pycni:{NETWORK}/cgone/eth0"])
    cid, _ = bridge_node.add(bridge_conf(pycni_ipam()), netns_factory("pod"))
    node.run(["ip", "link", "del", Attachment(NETWORK, cid, "eth0").host_veth])
    script = (
        f'add element inet pycni-masq masq4 {{ "pycni0" . {FREE} '
        f'comment "{NETWORK}/cfree/eth0" }}\n'
        "add table inet pycni-netpol\n"
        "add set inet pycni-netpol self4 { type ipv4_addr . ipv4_addr; }\n"
        f"add element inet pycni-netpol self4 {{ {GONE} . {GONE} }}\n"
        "add chain inet pycni-netpol in-x\n"
        "add map inet pycni-netpol ingress4 { type ipv4_addr : verdict; }\n"
        f"add element inet pycni-netpol ingress4 {{ {GONE} : goto in-x }}\n"
        "add table inet pycni-doctor-old\n"
    )
    node.run(["nft", "-f", "-"], input=script)
    make_departed_peer(node)
    return {
        "veth": "vethdoc0",
        "lease": f"{NETWORK}/{cid}/eth0",
        "masq-element": FREE,
        "netpol-element": GONE,
        "table": "inet pycni-doctor-old",
        "nft-object": "chain inet pycni-netpol in-x",  # no base chain reaches it
        "overlay-route": "10.99.0.0/26",
        "overlay-neigh": DEPARTED_VTEP,
        "overlay-fdb": DEPARTED_MAC,
        "overlay-peer": "peers4 { 192.0.2.1 }",
    }


def test_residue_is_found_repaired_and_gone(bridge_node, pycnid, netns_factory):
    live = netns_factory("pod")
    _, result = bridge_node.add(bridge_conf(pycni_ipam()), live)
    config = config_of(pycnid)
    expected = make_residue(bridge_node, netns_factory)
    assert live.ping(GATEWAY)

    code, doc = run_doctor(bridge_node.node, config)
    assert code == 2
    assert not any(f["kind"] == "lease" for f in doc["findings"])  # young: an ADD in flight?
    code, doc = run_doctor(bridge_node.node, config, "--grace=0")
    assert code == 2
    named = {(f["kind"], f["object"]) for f in doc["findings"]}
    for kind, obj in expected.items():
        assert any(k == kind and obj in o for k, o in named), (kind, obj, named)
    assert f"inet pycni-netpol ingress4 {{ {GONE} }}" in {o for _, o in named}  # a vmap's
    live_ip = re.compile(rf"\b{re.escape(ip_of(result))}\b(?!\.)")
    assert not any(live_ip.search(o) for _, o in named), named  # the live Pod is explained

    code, doc = run_doctor(bridge_node.node, config, "--repair", "--grace=0")
    assert code == 0 and all(f["repaired"] for f in doc["findings"]), doc
    assert live.ping(GATEWAY)
    assert_doctor_clean(bridge_node.node, config, "--grace=0")
    assert bridge_node.node.run("ip link show vethdoc1", check=False).returncode != 0
    assert live.ping(GATEWAY)
