"""One doctor run: read the node, find what nothing explains, repair it when asked, and say so
as one document (``to_document``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from cni.spec.errors import CNIError, IOFailure
from doctor.checks import NODE_CHECKS
from doctor.findings import Finding, NodeFacts
from doctor.peers import (
    find_overlay_fdb,
    find_overlay_firewall,
    find_overlay_neighbours,
    find_overlay_proxies,
    find_overlay_routes,
)
from doctor.read import read_facts
from doctor.repair import REPAIRS
from kernel.nft import Nft, NftError
from store.base import Store

# every check, in the order its findings are printed (a repair takes them in that order too:
# routes before FDB entries before neighbours, as overlay/dataplane.py removes them)
CHECKS = (
    *NODE_CHECKS,
    find_overlay_routes,
    find_overlay_fdb,
    find_overlay_neighbours,
    find_overlay_proxies,
    find_overlay_firewall,
)
#: what reading or changing the kernel raises (netlink, nft, the netns)
MECHANISM_ERRORS = (NetlinkError, OSError, NftError)


@dataclass(frozen=True)
class Outcome:
    finding: Finding
    repaired: bool | None  # None: not asked to repair
    error: str = ""


def find_all(facts: NodeFacts) -> list[Finding]:
    return [finding for check in CHECKS for finding in check(facts)]


@dataclass(frozen=True)
class Scope:
    """What the doctor judges on this node, from the CLI and pycnid's config."""

    node: str
    networks: tuple[str, ...]  # where pycni-bridge leases from pycni-ipam
    device: str | None  # the overlay's VXLAN device; None: no overlay
    endpoints_in_store: bool  # False: the proxy's endpoints come from the API server
    grace: float  # seconds a new lease may wait for its host veth
    settle: float = 0.0  # seconds between the two looks (``find_lasting``)


def run_doctor(store: Store, nft: Nft, scope: Scope, repair: bool) -> list[Outcome]:
    findings = find_lasting(lambda: read_scope(store, nft, scope), scope.settle)
    if not repair:
        return [Outcome(finding, None) for finding in findings]
    return [repair_one(store, nft, finding) for finding in findings]


def read_scope(store: Store, nft: Nft, scope: Scope) -> NodeFacts:
    try:
        young_after = time.time() - scope.grace
        return read_facts(
            store,
            nft,
            scope.node,
            scope.networks,
            scope.device,
            scope.endpoints_in_store,
            young_after,
        )
    except MECHANISM_ERRORS as exc:
        raise IOFailure(
            "could not read this node's interfaces, routes or nftables",
            f"{type(exc).__name__}: {exc} (run it as root in the node's network namespace)",
        ) from None


def find_lasting(read: Callable[[], NodeFacts], settle: float) -> list[Finding]:
    """What a second look ``settle`` seconds after the first still finds: a DEL returns
    before pycnid's next NetworkPolicy pass takes the Pod's elements out (and its proxy's
    the Pod's backends), so a node looked at once just after a DEL showed them as residue.
    Nothing found at first: one look only. The second look's findings are what a repair
    acts on."""
    first = find_all(read())
    if not first or settle <= 0:
        return first
    time.sleep(settle)
    seen = {(f.kind, f.object) for f in first}
    return [f for f in find_all(read()) if (f.kind, f.object) in seen]


def repair_one(store: Store, nft: Nft, finding: Finding) -> Outcome:
    """One repair; one that fails is reported with why, and the others still run."""
    try:
        error = REPAIRS[finding.kind](store, nft, finding)
    except (*MECHANISM_ERRORS, CNIError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    return Outcome(finding, error is None, error or "")


def to_document(scope: Scope, outcomes: list[Outcome]) -> dict[str, Any]:
    return {
        "node": scope.node,
        "networks": sorted(scope.networks),
        "clean": not outcomes,
        "findings": [o.finding.to_dict(o.repaired, o.error) for o in outcomes],
    }


def exit_status(outcomes: list[Outcome]) -> int:
    """0: nothing found, or everything found repaired; 2: something found and left."""
    return 2 if any(o.repaired is not True for o in outcomes) else 0
