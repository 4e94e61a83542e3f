"""netpol/isolate.py against the whole render: for generated clusters, one Pod of node n1 is
the new one. Against the layout of the cluster without it (what the kernel holds), its pins
are None exactly when that layout lacks the chain of its policies in a direction; otherwise the
layout with the pins has, for every address of the Pod, exactly the map entries (ingress,
egress, self) that the layout of the cluster with it has, and every other entry as before. A
pass that read its inputs before the Pod (``with_pins`` over the old layout) keeps them."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from netpol.evaluate import PodInfo, policies_of
from netpol.isolate import calc_pins, with_pins
from netpol.render import DIRECTIONS, FAMILIES, VMAP, Layout, calc_layout, shape_name
from tests.fixtures.netpol_cases import clusters, inputs_of

NODE = "n1"
MAPS = [f"{m}{f}" for m in VMAP.values() for f in FAMILIES] + [f"self{f}" for f in FAMILIES]


def entries_of(layout: Layout, pod: PodInfo) -> dict[str, set[str]]:
    """The map and self-set entries of ``layout`` that name one of ``pod``'s addresses."""
    mine = {ip.split("/")[0] for ip in pod.ips}
    return {
        name: {e for e in layout.sets[name].elements if e.split(" ")[0] in mine} for name in MAPS
    }


def others_of(layout: Layout, pod: PodInfo) -> dict[str, set[str]]:
    mine = {ip.split("/")[0] for ip in pod.ips}
    return {
        name: {e for e in layout.sets[name].elements if e.split(" ")[0] not in mine}
        for name in MAPS
    }


@settings(max_examples=150, deadline=None)
@given(clusters(), st.integers(0, 8))
def test_pins_give_the_new_pods_entries_of_the_whole_render(cluster, index):
    inputs = inputs_of(cluster)
    local = [p for p in inputs.pods if p.node == NODE]
    if not local:
        return
    pod = local[index % len(local)]
    before = replace(inputs, pods=tuple(p for p in inputs.pods if p is not pod))
    held, whole = calc_layout(before, NODE), calc_layout(inputs, NODE)
    isolating = {d: policies_of(inputs, pod, d) for d in DIRECTIONS}
    pins = calc_pins(held, pod, isolating)
    needed = [shape_name(DIRECTIONS[d][0], found) for d, found in isolating.items() if found]
    assert (pins is None) == any(chain not in held.chains for chain in needed)
    if pins is None:
        return
    pinned = with_pins(held, pins)
    assert pinned is not None
    assert entries_of(pinned, pod) == entries_of(whole, pod) if needed else True
    assert others_of(pinned, pod) == others_of(held, pod)
    assert pinned.chains == held.chains
