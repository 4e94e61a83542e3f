"""The rulesets `make bench-svc` loads, in a real nft: the kube-proxy shape of the mixed
Services loads and holds the chains, maps and affinity sets kube-proxy's nftables mode
renders for them, and takes the bench's updates (a Local-policy load balancer's endpoint, an
affinity Service's); pycni's script for the same Services loads with the elements of every
feature. No timing: that is the bench's job."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from bench import svc_kube as kube
from bench import svc_shapes as shapes
from services.proxy.table import render_transaction

pytestmark = pytest.mark.netns
N = 200


def _list(ns, what: str) -> list[dict]:
    out = ns.run(["nft", "-j", "list", *what.split()]).stdout
    return json.loads(out)["nftables"]


def _chains(ns, table: str) -> Counter:
    """The table's chains by kind (its name up to the hash, or whole for a static one)."""
    names = [c["chain"]["name"] for c in _list(ns, f"table ip {table}") if "chain" in c]
    return Counter(re.sub(r"-[A-Z2-7]{8,10}(-.*)?$", "", name) for name in names)


def _elements(ns, table: str, kind: str, name: str) -> int:
    found = [o[kind] for o in _list(ns, f"{kind} ip {table} {name}") if kind in o]
    return len(found[0].get("elem", [])) if found else 0


def test_the_kube_shape_of_the_mix_loads_with_its_chains_and_takes_updates(netns_factory):
    ns = netns_factory("bench")
    plan = shapes.calc_plan(N)
    ns.run(["nft", "-f", "-"], input=kube.render_full(plan))
    chains = _chains(ns, "kube-proxy")
    assert chains["service"] == N and chains["endpoint"] == N * shapes.ENDPOINTS
    assert chains["external"] == sum(s.external for s in plan) == 30
    assert chains["local"] == sum(s.local for s in plan) == 10
    assert chains["firewall"] == sum(bool(s.ranges) for s in plan) == 4
    assert sum(chains.values()) == kube.calc_chain_count(plan)
    assert _elements(ns, "kube-proxy", "map", "service-ips") == shapes.calc_dispatch_count(plan)
    assert _elements(ns, "kube-proxy", "map", "service-nodeports") == 30
    assert _elements(ns, "kube-proxy", "map", "firewall-ips") == 4
    sets = [o["set"] for o in _list(ns, "sets ip") if "set" in o]
    sticky = [s for s in sets if s["name"].startswith("affinity-")]
    assert len(sticky) == 10 * shapes.ENDPOINTS
    assert all(s["timeout"] == 10800 and "timeout" in s["flags"] for s in sticky)

    new = shapes.calc_swap(plan, 1)
    ns.run(["nft", "-f", "-"], input=kube.render_update(plan, new))
    i = next(i for i, s in enumerate(new) if s.affinity)
    newer = list(new)
    newer[i] = new[i]._replace(eps=(shapes.SPARE[60001], *new[i].eps[1:]))
    ns.run(["nft", "-f", "-"], input=kube.render_update(new, newer))
    after = _chains(ns, "kube-proxy")
    assert after == chains
    sets = [o["set"]["name"] for o in _list(ns, "sets ip") if "set" in o]
    assert len([s for s in sets if s.startswith("affinity-")]) == 10 * shapes.ENDPOINTS
    assert any(str(shapes.SPARE[60001]) in s for s in sets)


def test_pycni_script_of_the_mix_loads_with_every_feature(netns_factory):
    ns = netns_factory("bench")
    plan = shapes.calc_plan(N)
    ns.run(["nft", "-f", "-"], input=render_transaction(None, shapes.build_model(plan)))
    t = "pycni-svc"
    assert _elements(ns, t, "map", "service-ips") == shapes.calc_dispatch_count(plan)
    assert _elements(ns, t, "map", "service-nodeports") == 30
    assert _elements(ns, t, "set", "firewall-ips") == 4
    assert _elements(ns, t, "map", "sc-service-nodeports") == 10
    assert _chains(ns, t)["sticky"] == 10
