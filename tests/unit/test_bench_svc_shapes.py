"""The bench's two rulesets serve the same Services, with the same features, and its update
is one endpoint of one Service on both shapes: otherwise `make bench-svc` would compare
different work."""

from __future__ import annotations

import re
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from bench import svc_kube as kube
from bench import svc_shapes as shapes
from services.proxy.elements import calc_elements, calc_service_parts
from services.proxy.render import AffinityChain
from services.proxy.table import group_views, render_transaction

sizes = st.integers(min_value=1, max_value=240)
mixes = st.sampled_from(shapes.MIXES)


@settings(max_examples=40, deadline=None)
@given(sizes, mixes)
def test_every_address_and_node_port_of_the_plan_is_unique_and_in_its_pool(n, mix):
    plan = shapes.calc_plan(n, mix)
    vips = [s.vip for s in plan]
    eps = [ip for s in plan for ip in s.eps]
    assert len(set(vips)) == n and all(v in shapes.VIPS for v in vips)
    assert len(set(eps)) == n * shapes.ENDPOINTS and all(ip in shapes.PODS for ip in eps)
    assert not set(eps) & {shapes.SPARE[1 + i % 60000] for i in range(n)}
    lbs = [s.lb_ip for s in plan if s.lb_ip is not None]
    assert len(set(lbs)) == len(lbs) and all(ip in shapes.LB_IPS for ip in lbs)
    ports = [s.node_port for s in plan if s.node_port]
    assert len(set(ports)) == len(ports) and all(30000 <= p < 65536 for p in ports)


def test_the_mix_has_the_proportions_the_docstring_states():
    plan = shapes.calc_plan(1000)
    kinds = Counter(s.kind for s in plan)
    assert kinds == {"LoadBalancer": 50, "NodePort": 100, "ClusterIP": 850}
    assert sum(s.local for s in plan) == 50 and all(s.external for s in plan if s.local)
    assert sum(bool(s.ranges) for s in plan) == 20
    assert all(s.kind == "LoadBalancer" for s in plan if s.ranges)
    assert sum(s.affinity for s in plan) == 50
    assert {s.kind for s in plan if s.affinity} == {"LoadBalancer", "NodePort", "ClusterIP"}
    assert all(s.node_port for s in plan if s.external)
    assert all(
        s.kind == "ClusterIP" and not s.affinity for s in shapes.calc_plan(300, "clusterip")
    )


def test_a_local_policy_service_has_local_and_remote_endpoints():
    for svc in shapes.calc_plan(200):
        nodes = shapes.calc_endpoint_nodes(svc)
        if svc.local:
            assert nodes.count(shapes.NODE.node) == shapes.LOCAL_ENDPOINTS, svc
        assert len(nodes) == shapes.ENDPOINTS


@settings(max_examples=40, deadline=None)
@given(sizes, st.integers(min_value=0, max_value=5), mixes)
def test_a_swap_changes_one_endpoint_of_one_service_and_back(n, r, mix):
    plan = shapes.calc_plan(n, mix)
    swapped = shapes.calc_swap(plan, r)
    changed = [(a, b) for a, b in zip(plan, swapped, strict=True) if a != b]
    assert len(changed) == (r % 2)
    for a, b in changed:
        assert a._replace(eps=b.eps) == b and len(set(a.eps) ^ set(b.eps)) == 2
        assert shapes.calc_endpoint_nodes(a)[0] == shapes.calc_endpoint_nodes(b)[0] or not a.local


def test_the_mixed_update_is_a_local_policy_load_balancer_with_source_ranges():
    for n in (100, 1000, 10000):
        svc = shapes.calc_plan(n)[shapes.calc_update_index(n)]
        assert svc.kind == "LoadBalancer" and svc.local and svc.ranges
        assert shapes.calc_endpoint_nodes(svc)[0] == shapes.NODE.node


def test_the_records_make_the_model_the_bench_describes():
    """The proxy's model of the records: the measured node, every feature where the plan
    puts it (load balancer IP, source ranges, nodePort, Local policy, affinity timeout)."""
    plan = shapes.calc_plan(100)
    model = shapes.build_model(plan)
    assert model.node == shapes.NODE
    views = {v.service.name: v for v in model.ports}
    assert len(views) == 100
    for svc in plan:
        view = views[svc.name]
        assert view.service.vips == (svc.vip,)
        assert view.service.load_balancer_ips == ((svc.lb_ip,) if svc.lb_ip else ())
        assert [str(n) for n in view.service.source_ranges] == list(svc.ranges)
        assert view.port.node_port == (svc.node_port or None)
        assert view.service.external_local == svc.local
        assert view.service.affinity_timeout == (10800 if svc.affinity else None)
        assert [b.ip for b in view.backends] == sorted(svc.eps)
        nodes = dict(zip(svc.eps, shapes.calc_endpoint_nodes(svc), strict=True))
        assert all(b.local == (nodes[b.ip] == shapes.NODE.node) for b in view.backends)


def test_the_pycni_elements_have_every_feature():
    """Load balancer dispatch, firewall, NodePort, short-circuit and affinity elements are
    there, as many as the plan has of each."""
    plan = shapes.calc_plan(100)
    model = shapes.build_model(plan)
    names = Counter(e.name for e in calc_elements(model))
    assert names["service-ips"] == shapes.calc_dispatch_count(plan) == 105
    assert names["service-nodeports"] == 15
    assert names["firewall-ips"] == 2 and names["firewall-allow"] == 4
    assert names["sc-service-ips"] == 2 and names["sc-service-nodeports"] == 5
    assert names["nodeport-masq"] == 10 and names["external-masq"] == 3
    sticky = set()
    for views in group_views(model.ports).values():
        sticky |= {
            s
            for s in calc_service_parts(model.__class__(4, model.node, views))[1]
            if isinstance(s, AffinityChain)
        }
    assert len(sticky) == 5 and all(s.timeout == 10800 for s in sticky)


@settings(max_examples=20, deadline=None)
@given(sizes)
def test_both_shapes_render_the_same_update(n):
    plan = shapes.calc_plan(n)
    new = shapes.calc_swap(plan, 1)
    text = kube.render_update(plan, new)
    assert len(re.findall(r"^add chain .* endpoint-", text, re.M)) == 1
    assert len(re.findall(r"^delete chain .* endpoint-", text, re.M)) == 1
    svc = plan[shapes.calc_update_index(n)]
    refilled = re.findall(r"^flush chain \S+ \S+ (\w+)-", text, re.M)
    assert refilled == ["service", *(["local"] if svc.local else []), "endpoint"]
    script = render_transaction(shapes.build_model(plan), shapes.build_model(new))
    changed = {
        name for _verb, name in re.findall(r"^(add|delete) element \S+ \S+ (\S+)", script, re.M)
    }
    assert "backends-tcp" in changed and "hairpin" in changed
    if svc.local:  # its local endpoint changed: the Local dispatch and the short-circuit
        assert {"np-backends-tcp", "sc-backends-tcp", "sc-np-backends-tcp"} <= changed


def test_an_affinity_update_swaps_the_endpoints_set_in_the_kube_shape():
    plan = shapes.calc_plan(100)
    i = next(i for i, s in enumerate(plan) if s.affinity)
    new = list(plan)
    new[i] = plan[i]._replace(eps=(shapes.SPARE[1], *plan[i].eps[1:]))
    text = kube.render_update(plan, new)
    assert len(re.findall(r"^add set \S+ \S+ affinity-", text, re.M)) == 1
    assert len(re.findall(r"^delete set \S+ \S+ affinity-", text, re.M)) == 1
    assert text.count(" saddr @affinity-") == shapes.ENDPOINTS


@settings(max_examples=20, deadline=None)
@given(sizes, mixes)
def test_the_kube_shape_has_its_chains_and_elements(n, mix):
    plan = shapes.calc_plan(n, mix)
    text = kube.render_full(plan)
    chains = Counter(re.findall(r"^add chain \S+ \S+ (\w+)-[A-Z2-7]{8}-", text, re.M))
    local = [s for s in plan if s.local]
    assert chains == {
        k: v
        for k, v in {
            "service": n,
            "endpoint": n * shapes.ENDPOINTS,
            "external": sum(s.external for s in plan),
            "local": len(local),
            "firewall": sum(bool(s.ranges) for s in plan),
        }.items()
        if v
    }
    assert len(re.findall(r"^add chain ", text, re.M)) == kube.calc_chain_count(plan)
    maps = Counter(re.findall(r"^add element \S+ \S+ (\S+) ", text, re.M))
    assert maps["service-ips"] == shapes.calc_dispatch_count(plan)
    assert maps["service-nodeports"] == sum(s.external for s in plan)
    assert maps["firewall-ips"] == sum(bool(s.ranges) for s in plan)
    assert maps["cluster-ips"] == n
    affinity = sum(s.affinity for s in plan)
    assert len(re.findall(r"^add set \S+ \S+ affinity-", text, re.M)) == affinity * 5
    assert len(re.findall(r"update @affinity-", text)) == affinity * 5
