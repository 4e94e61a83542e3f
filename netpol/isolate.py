"""Isolating one new Pod at once (pure): the elements its ADD adds to the layout the kernel
holds, so the ADD returns without waiting for a whole pass (``sync.NetpolSync.settle``).

A Pod whose policies (by direction) make a shape chain the kernel already holds (another Pod
of the node with the same policies: a Deployment's next replica) is isolated by its map
entries alone: ``<ip> : jump <chain>`` in ``ingress4``/``egress4`` (…6), and ``<ip> . <ip>``
in ``self4`` (a Pod reaches itself). A chain is named by its policies' content
(``render.shape_name``), so one the kernel holds has exactly the rules a pass would render.
What the pass adds besides (the Pod's drop counter, its address in other Pods' peer sets) only
allows or counts, so it can follow. A Pod no policy selects needs nothing. ``calc_pins`` is
None when the kernel lacks the chain: the ADD then waits for a pass, as before.

The entries are pins until a pass whose inputs were read after them is committed: a pass that
read its inputs before the Pod's record has them laid over its layout (``with_pins``), so it
never takes them away.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from netpol.evaluate import PodInfo
from netpol.members import addresses
from netpol.policy import NetworkPolicy
from netpol.render import DIRECTIONS, FAMILIES, VMAP, Layout, shape_name

Pin = tuple[str, str]  # (set or map name, element)


def calc_pins(
    layout: Layout, pod: PodInfo, isolating: Mapping[str, Sequence[NetworkPolicy]]
) -> list[Pin] | None:
    """The elements that isolate ``pod`` (``isolating``: direction -> its policies sorted by
    ref, as ``evaluate.policies_of`` gives them); None when ``layout`` lacks a chain."""
    pins: list[Pin] = []
    for direction, policies in isolating.items():
        if not policies:
            continue
        chain = shape_name(DIRECTIONS[direction][0], list(policies))
        if chain not in layout.chains:
            return None
        pins += [
            (f"{VMAP[direction]}{f}", f"{ip} : jump {chain}")
            for f in FAMILIES
            for ip in addresses(pod, f)
        ]
    if pins:
        pins += [(f"self{f}", f"{ip} . {ip}") for f in FAMILIES for ip in addresses(pod, f)]
    return pins


def with_pins(layout: Layout, pins: Sequence[Pin]) -> Layout | None:
    """``layout`` with the pinned elements (a map's entry for the same key replaced); None
    when a set, map or chain they name is not in it."""
    sets = dict(layout.sets)
    for name, element in pins:
        found = sets.get(name)
        if found is None:
            return None
        if found.kind == "map":
            key, _, verdict = element.partition(" : ")
            if verdict.removeprefix("jump ") not in layout.chains:
                return None
            kept = [e for e in found.elements if e.partition(" : ")[0] != key]
            sets[name] = replace(found, elements=(*kept, element))
        elif element not in found.elements:
            sets[name] = replace(found, elements=(*found.elements, element))
    return replace(layout, sets=sets)
