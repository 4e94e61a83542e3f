"""netpol/render.LayoutCache against a render from nothing, pass after pass (generated).

What a render keeps for the next (sets under their stamps and deps, shape chains, each local
Pod's entries, the kept parts of a relabelled namespace, the shapes taken unchecked) must
never outlive what it was computed from: every pass with the cache equals a render of the
same inputs from nothing, to the order of the script. ``passes`` draws whole clusters one
after the other with objects kept as the sources keep them; ``relabels`` one cluster whose
Pods are relabelled a few at a time. `make test` runs 200 cases of each, `make fuzz` 50x
(the one-peer-stops-picking case of tests/unit/test_netpol_render.py was found by a case the
unit suite had not drawn before)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from netpol.evaluate import PolicyInputs
from netpol.members import N, group_by_namespace, same_objects
from netpol.render import LayoutCache, calc_layout, render_full
from tests.fixtures.netpol_cases import KEYS, VALUES, clusters, inputs_of
from tests.fuzz.budget import cases

NODE = "n1"


@st.composite
def passes(draw: st.DrawFn) -> list[PolicyInputs]:
    """Successive inputs as the sync's sources hand them over: a Pod, the policies or the
    namespaces' labels that did not change are the same objects as in the pass before (a Pod
    may also go); the Pods and the policies by namespace given as ``view.Records`` gives them
    (an unchanged namespace's tuple kept), or not at all."""
    found: list[PolicyInputs] = []
    for _ in range(draw(st.integers(2, 5))):
        drawn = inputs_of(draw(clusters()))
        last = found[-1] if found else drawn
        if draw(st.booleans()):
            pods = last.pods
        else:
            olds = {p.ref: p for p in last.pods}
            pods = tuple(
                olds.get(p.ref, p) if draw(st.booleans()) else p
                for p in drawn.pods
                if draw(st.integers(0, 5))  # 1 in 6 gone
            )
        policies = last.policies if draw(st.booleans()) else drawn.policies
        found.append(
            PolicyInputs(
                pods,
                last.namespaces if draw(st.booleans()) else drawn.namespaces,
                policies,
                drawn.node_ips,
                groups=kept_groups(last.groups, pods) if draw(st.booleans()) else None,
                policy_groups=(
                    kept_groups(last.policy_groups, policies) if draw(st.booleans()) else None
                ),
            )
        )
    return found


def kept_groups(before: Mapping[str, tuple[N, ...]] | None, items: Sequence[N]) -> dict:
    """``items`` by namespace as the sources keep them: a namespace whose members are the same
    objects as ``before``'s keeps its tuple."""
    before = before or {}
    return {
        ns: before[ns] if same_objects(before.get(ns, ()), made) else made
        for ns, made in group_by_namespace(items).items()
    }


@cases(200)
@given(passes())
def test_a_layout_cache_kept_between_passes_renders_what_a_fresh_render_does(
    inputs_seq: list[PolicyInputs],
) -> None:
    """What ``LayoutCache`` keeps (sets under their stamps, shape chains, each Pod's chain)
    never outlives what it was computed from: every pass equals a render from nothing, to the
    order of the script."""
    cache = LayoutCache()
    for inputs in inputs_seq:
        kept, fresh = calc_layout(inputs, NODE, cache=cache), calc_layout(inputs, NODE)
        assert kept == fresh
        assert render_full(kept) == render_full(fresh)


@st.composite
def relabels(draw: st.DrawFn) -> list[PolicyInputs]:
    """One cluster, then passes that each change one to three of its Pods as a relabel does
    (labels set or dropped, now and then the addresses or named ports of another Pod): the
    other Pods, the policies, the namespaces' labels and the unchanged namespaces' tuples are
    the same objects as the pass before, as ``view.Records`` hands them over."""
    first = inputs_of(draw(clusters()))
    found = [replace(first, groups=group_by_namespace(first.pods))]
    for _ in range(draw(st.integers(1, 5)) if first.pods else 0):
        last = found[-1]
        pods = list(last.pods)
        for i in draw(st.lists(st.integers(0, len(pods) - 1), min_size=1, max_size=3)):
            labels = {**pods[i].labels, **draw(st.dictionaries(st.sampled_from(KEYS), VALUE))}
            if labels and draw(st.booleans()):
                del labels[draw(st.sampled_from(sorted(labels)))]
            ips = pods[i].ips if draw(st.integers(0, 3)) else draw(st.sampled_from(pods)).ips
            ports = pods[i].ports if draw(st.integers(0, 3)) else draw(st.sampled_from(pods)).ports
            pods[i] = replace(pods[i], labels=labels, ips=ips, ports=ports)
        kept = tuple(pods)
        found.append(replace(last, pods=kept, groups=kept_groups(last.groups, kept)))
    return found


VALUE = st.sampled_from(VALUES)


@cases(200)
@given(relabels())
def test_relabelled_pods_render_with_the_cache_what_a_fresh_render_does(
    inputs_seq: list[PolicyInputs],
) -> None:
    """A relabel keeps every other Pod's entries and the parts its change did not touch
    (``Grouping.part``'s kept parts, ``Render.calc_local``'s kept entries): each pass still
    equals a render from nothing."""
    cache = LayoutCache()
    for inputs in inputs_seq:
        kept, fresh = calc_layout(inputs, NODE, cache=cache), calc_layout(inputs, NODE)
        assert kept == fresh
        assert render_full(kept) == render_full(fresh)
