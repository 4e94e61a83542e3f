"""The external entries' objects in a real nft, through one kept libnftables context as pycnid
runs them, IPv4 and IPv6: the pre-DNAT firewall's interval set takes a full render and the
element diffs that change a Service's ranges, holding exactly the rendered intervals after
each; the short-circuit dispatch of a Local-policy Service with ClientIP affinity (its
``sc-aff``/``sc-np-aff`` chains and ``sc-slot-i`` maps) loads, shrinks and grows back."""

from __future__ import annotations

import ipaddress
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from services.proxy.elements import calc_elements
from services.proxy.model import ProxyModel
from services.proxy.render import calc_affinity_chain_name
from services.proxy.table import render_transaction
from tests.fixtures.svc_kernel import calc_set_elements
from tests.fixtures.svc_model import BALANCED_MODEL, NODE6, be, view

pytestmark = pytest.mark.netns
ROOT = Path(__file__).resolve().parents[2]
NFT_KEPT_CONTEXT = """
import sys
from kernel.nft import Nft
nft = Nft()
for path in sys.argv[1:]:
    nft.run(open(path).read())
"""
N = ipaddress.ip_network


def fenced6() -> ProxyModel:
    svc = replace(
        BALANCED_MODEL.ports[0].service,
        vips=(ipaddress.ip_address("fd96::14"),),
        load_balancer_ips=(ipaddress.ip_address("2001:db8::10"),),
        source_ranges=(N("2001:db8:1::/48"), N("fd01::/64")),  # fd01::2: the node's
    )
    return ProxyModel(6, NODE6, (view(svc, svc.ports[0], be("fd00::2", 8443)),))


def with_ranges(model: ProxyModel, *ranges: str) -> ProxyModel:
    v = model.ports[0]
    svc = replace(v.service, source_ranges=tuple(map(N, ranges)))
    return replace(model, ports=(replace(v, service=svc),))


def listed(ns, family: int, name: str) -> int:
    return len(calc_set_elements(ns.run, family, name))


@pytest.mark.parametrize(
    "m0,ranges",
    [
        (BALANCED_MODEL, ("203.0.113.0/25", "203.0.113.0/24", "10.0.0.0/8")),  # nested
        (fenced6(), ("2001:db8::/32", "::/0")),
    ],
    ids=["ipv4", "ipv6"],
)
def test_changed_source_ranges_apply_as_element_diffs(netns_factory, tmp_path, m0, ranges):
    m1, m2 = with_ranges(m0, *ranges), with_ranges(m0)
    steps = [(None, m0), (m0, m1), (m1, m2), (m2, m0)]
    paths = []
    for i, (before, after) in enumerate(steps):
        paths.append(tmp_path / f"t{i}.nft")
        paths[-1].write_text(render_transaction(before, after))
    for upto, (_, model) in enumerate(steps, 1):  # each state, reached through the diffs
        ns = netns_factory(f"svcfw{upto}")
        ns.run([sys.executable, "-c", NFT_KEPT_CONTEXT, *map(str, paths[:upto])], cwd=ROOT)
        want = [e.name for e in calc_elements(model) if e.name.startswith("firewall-")]
        for name in ("firewall-ips", "firewall-allow"):
            assert listed(ns, m0.family, name) == want.count(name), (upto, name)
    assert not any(e.name.startswith("firewall-") for e in calc_elements(m2))  # unfenced


def short_circuit_model(family: int) -> ProxyModel:
    """A Local-policy NodePort + externalIP Service with affinity, one endpoint here and one
    elsewhere: the Local twin, and the port's chain of every endpoint the short-circuit uses."""
    v = BALANCED_MODEL.ports[0] if family == 4 else fenced6().ports[0]
    svc = replace(v.service, affinity_timeout=60, source_ranges=())
    far = be("10.0.1.2" if family == 4 else "fd00::3", 8443, local=False)
    node = BALANCED_MODEL.node if family == 4 else NODE6
    return ProxyModel(family, node, (view(svc, svc.ports[0], v.backends[0], far),))


@pytest.mark.parametrize("family", [4, 6])
def test_a_short_circuit_with_affinity_loads_and_diffs(netns_factory, tmp_path, family):
    m0 = short_circuit_model(family)
    v = m0.ports[0]
    m1 = replace(m0, ports=(replace(v, backends=v.backends[1:]),))
    paths = []
    for i, (before, after) in enumerate([(None, m0), (m0, m1), (m1, m0)]):
        paths.append(tmp_path / f"t{i}.nft")
        paths[-1].write_text(render_transaction(before, after))
    ns = netns_factory("svcsc")
    ns.run([sys.executable, "-c", NFT_KEPT_CONTEXT, *map(str, paths)], cwd=ROOT)
    table = "ip6" if family == 6 else "ip"
    chains = ns.run(["nft", "list", "chains", table]).stdout
    svc, port = v.service, v.port
    full = calc_affinity_chain_name(svc.namespace, svc.name, port.protocol, port.port, False)
    local = calc_affinity_chain_name(svc.namespace, svc.name, port.protocol, port.port, True)
    assert f"chain {full} " in chains and f"chain {local} " in chains
    elements = calc_elements(m0)
    for name in ("sc-service-ips", "sc-service-nodeports"):  # the short-circuit: every endpoint
        short = [e for e in elements if e.name == name]
        assert short and all(e.value == f"goto {full}" for e in short), name
        out = json.loads(ns.run(["nft", "-j", "list", "map", table, "pycni-svc", name]).stdout)
        assert len([o["map"] for o in out["nftables"] if "map" in o][0].get("elem", [])) == len(
            short
        )
