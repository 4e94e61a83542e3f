"""The bench's two rulesets serve the same Services, and its update is one endpoint of one
Service on both shapes: otherwise `make bench-svc` would compare different work."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from bench import svc_shapes as shapes
from services.proxy.table import render_transaction

sizes = st.integers(min_value=1, max_value=120)


@settings(max_examples=40, deadline=None)
@given(sizes)
def test_every_address_of_the_plan_is_unique_and_in_its_pool(n):
    plan = shapes.calc_plan(n)
    vips = [vip for _n, vip, _e in plan]
    eps = [ip for _n, _v, e in plan for ip in e]
    assert len(set(vips)) == n and all(v in shapes.VIPS for v in vips)
    assert len(set(eps)) == n * shapes.ENDPOINTS and all(ip in shapes.PODS for ip in eps)
    assert not set(eps) & {shapes.SPARE[1 + i % 60000] for i in range(n)}


@settings(max_examples=40, deadline=None)
@given(sizes, st.integers(min_value=0, max_value=5))
def test_a_swap_changes_one_endpoint_of_one_service_and_back(n, r):
    plan, swapped = shapes.calc_plan(n), shapes.calc_swap(shapes.calc_plan(n), r)
    changed = [(a, b) for a, b in zip(plan, swapped, strict=True) if a != b]
    assert len(changed) == (r % 2)
    for (_n, vip0, eps0), (_m, vip1, eps1) in changed:
        assert vip0 == vip1 and len(set(eps0) ^ set(eps1)) == 2


@settings(max_examples=30, deadline=None)
@given(sizes)
def test_both_shapes_render_the_same_update(n):
    plan = shapes.calc_plan(n)
    new = shapes.calc_swap(plan, 1)
    kube = shapes.render_kube_update(plan, new)
    assert len(re.findall(r"^add chain .* endpoint-", kube, re.M)) == 1
    assert len(re.findall(r"^delete chain .* endpoint-", kube, re.M)) == 1
    m0 = shapes.build_model(plan)
    script = render_transaction(m0, shapes.swap_model(m0, new))
    verbs = re.findall(r"^(add|delete) element ip pycni-svc (\S+) \{ ([^}]*) \}$", script, re.M)
    assert sorted((verb, name) for verb, name, _ in verbs) == [
        ("add", "backends-tcp"),
        ("add", "hairpin"),
        ("delete", "backends-tcp"),
        ("delete", "hairpin"),
    ]
    assert script.count("\n") == len(verbs)


@settings(max_examples=20, deadline=None)
@given(sizes)
def test_the_kube_shape_has_its_chains_and_one_dispatch_element_per_service(n):
    text = shapes.render_kube_full(shapes.calc_plan(n))
    assert len(re.findall(r"^add chain ", text, re.M)) == 10 + n * (1 + shapes.ENDPOINTS)
    assert len(re.findall(r"^add element .* service-ips ", text, re.M)) == n
