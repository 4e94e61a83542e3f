"""One doctor run: read the node, find what nothing explains, repair it when asked, and say so
as one document (``to_document``)."""

from __future__ import annotations

import time
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


def run_doctor(store: Store, nft: Nft, scope: Scope, repair: bool) -> list[Outcome]:
    try:
        young_after = time.time() - scope.grace
        facts = read_facts(
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
    findings = find_all(facts)
    if not repair:
        return [Outcome(finding, None) for finding in findings]
    return [repair_one(store, nft, finding) for finding in findings]


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
