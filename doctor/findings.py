"""What the doctor reads and what it reports (plain data, no I/O).

``NodeFacts`` is one look at the node (its kernel and the store's records of it); the checks
(``doctor/checks.py``) turn it into ``Finding``s; ``doctor/repair.py`` repairs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ipam.ops.check import Finding as IpamProblem
from ipam.records import HandleRecord
from kernel.ndproxy import Proxy
from kernel.neigh import Fdb, Neigh
from kernel.route import Route
from masq import rules as masq_rules
from masq.rules import Element
from netpol import render as netpol_render
from nodes.record import OverlayInfo
from overlay import firewall as overlay_firewall
from services.proxy import render as proxy_render
from store.base import KV

TABLE_PREFIX = "pycni-"
#: (family, name) of every table the current code makes, from the owners' constants
CURRENT_TABLES = frozenset(
    {
        (masq_rules.FAMILY, masq_rules.TABLE),
        ("inet", netpol_render.TABLE),
        (overlay_firewall.FAMILY, overlay_firewall.TABLE),
        *((family, proxy_render.TABLE) for family in proxy_render.FAMILY.values()),
    }
)


@dataclass(frozen=True)
class Lease:
    """One pycni-ipam handle of an attachment, as read (its key and revision kept for the
    release's compare)."""

    kv: KV
    record: HandleRecord


@dataclass(frozen=True)
class Veth:
    name: str
    tag: str  # the attachment tag of its pycni alias


@dataclass(frozen=True)
class NftElement:
    """One element of a set or map of a pycni table, keyed by a Pod address."""

    family: str
    table: str
    set: str
    key: str  # in nft syntax
    address: str


@dataclass(frozen=True)
class NftTable:
    family: str
    name: str

    def __str__(self) -> str:
        return f"{self.family} {self.name}"


@dataclass(frozen=True)
class NftObject:
    """A chain, set or map of a table; ``ref`` names it as references do."""

    family: str
    table: str
    kind: str  # chain | set | map
    name: str

    @property
    def ref(self) -> str:
        return f"chain:{self.name}" if self.kind == "chain" else f"set:{self.name}"

    def __str__(self) -> str:
        return f"{self.kind} {self.family} {self.table} {self.name}"


@dataclass(frozen=True)
class TableGraph:
    """One table's chains, sets and maps, which of them hook into the kernel (base chains),
    and what each references: rules' jump/goto targets and @sets, maps' verdict targets."""

    objects: tuple[NftObject, ...]
    base: frozenset[str]  # refs of base chains
    refs: Mapping[str, frozenset[str]]


@dataclass(frozen=True)
class Peers:
    """What the store says of the other nodes (their records and blocks) and what this node's
    kernel holds for them with pycni's marks (``overlay/dataplane.py`` says which)."""

    recorded: frozenset[str] = frozenset()  # every node with a record, decodable or not
    overlays: tuple[OverlayInfo, ...] = ()  # of the records that decode
    blocks: tuple[tuple[str, str], ...] = ()  # (CIDR, owning node)
    allocated: frozenset[str] = frozenset()  # every address a block hands to some handle
    routes: tuple[Route, ...] = ()  # protocol 77, main table
    neighs: tuple[Neigh, ...] = ()  # protocol 77 on the VXLAN device
    fdbs: tuple[Fdb, ...] = ()  # on the VXLAN device, with a destination
    accepted: tuple[NftElement, ...] = ()  # the underlays VXLAN is accepted from (firewall)
    proxies: tuple[Proxy, ...] = ()  # IPv6 proxy entries with protocol 77, on the bridges


@dataclass(frozen=True)
class NodeFacts:
    node: str
    networks: frozenset[str]  # the networks pycni-bridge serves with pycni-ipam here
    ipam_problems: tuple[IpamProblem, ...] = ()
    leases: tuple[Lease, ...] = ()  # every attachment handle in the store, any node
    veths: tuple[Veth, ...] = ()
    masq: tuple[Element, ...] = ()
    masq_legacy: bool = False
    netpol: tuple[NftElement, ...] = ()
    tables: tuple[NftTable, ...] = ()
    peers: Peers = field(default_factory=Peers)
    backends: tuple[NftElement, ...] = ()  # the Service proxy's backends maps
    #: leases created after this unix time are not judged: an ADD takes its lease before it
    #: makes the host veth (plugins/bridge/add.py), so a young lease may be an ADD in flight
    young_after: float = float("inf")
    endpoint_ips: frozenset[str] | None = None  # None: endpoints come from the API server
    graphs: tuple[TableGraph, ...] = ()  # of the current pycni tables the kernel holds


@dataclass(frozen=True)
class Finding:
    """One thing nothing explains: ``kind`` says which check, ``object`` what it is, ``why``
    why it is unexplained; ``target`` is what its repair acts on."""

    kind: str
    object: str
    why: str
    target: Any = field(default=None, compare=False)

    def to_dict(self, repaired: bool | None = None, error: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "object": self.object, "why": self.why}
        out["repaired"] = repaired
        if error:
            out["error"] = error
        return out
