"""The IPAM records as stored (pure, no I/O): blocks, handles with their leased IPs, and the
affinity index entries; their keys are in ``store.keys``, their codec in ``store.codec``.

docs/store-layout.md has every prefix and the txns that write them. Records keep fields they do
not know (``extra``), so a newer pycnid writing more fields is not undone by an older one, nor
by ``pycni ipam``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from store.codec import CorruptRecord, decode, encode
from store.keys import block_key, handles_prefix, parse_block_key

IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network
DEFAULT_BLOCK_GRACE = 300.0  # seconds an empty block stays claimed before it goes back


@dataclass(frozen=True)
class HandleId:
    """One attachment: (network, containerID, ifname)."""

    network: str
    container_id: str
    ifname: str

    @property
    def key(self) -> str:
        return f"{handles_prefix(self.network)}{self.container_id}/{self.ifname}"

    def __str__(self) -> str:  # the value a block stores for an allocation
        return f"{self.network}/{self.container_id}/{self.ifname}"


@dataclass(frozen=True)
class BlockRecord:
    """A slice of a pool claimed by one node: which address is held by which handle.

    ``released`` {ip: unix time} remembers recent releases (reuse delay); ``borrowed``
    {ip: node} marks allocations made by a node other than ``affinity``; ``empty_since`` is
    when the last allocation went (the block returns to the pool after a grace period).
    """

    pool: str
    cidr: str
    affinity: str
    allocations: Mapping[str, str] = field(default_factory=dict)
    last: str | None = None  # the address handed out last (round robin resumes after it)
    claimed_at: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)
    released: Mapping[str, float] = field(default_factory=dict)
    borrowed: Mapping[str, str] = field(default_factory=dict)
    empty_since: float | None = None

    FIELDS = (
        "pool",
        "cidr",
        "affinity",
        "allocations",
        "last",
        "claimedAt",
        "released",
        "borrowed",
        "emptySince",
    )

    def with_allocation(
        self, address: str, holder: str, advance: bool = True, borrower: str | None = None
    ) -> BlockRecord:
        """Allocate ``address``; ``advance`` moves the round-robin cursor (not for static IPs);
        ``borrower``: the node allocating in another node's block."""
        borrowed = {a: n for a, n in self.borrowed.items() if a != address}
        if borrower is not None and borrower != self.affinity:
            borrowed[address] = borrower
        return replace(
            self,
            allocations={**self.allocations, address: holder},
            last=address if advance else self.last,
            empty_since=None,
            released={a: t for a, t in self.released.items() if a != address},
            borrowed=borrowed,
        )

    def without(self, address: str, released_at: float | None = None) -> BlockRecord:
        """Free ``address``; ``released_at`` starts its reuse delay and, when it was the last
        allocation, the block's empty grace period."""
        allocations = {a: h for a, h in self.allocations.items() if a != address}
        released = dict(self.released)
        empty_since = self.empty_since
        if released_at is not None:
            released[address] = released_at
            if not allocations and empty_since is None:
                empty_since = released_at
        return replace(
            self,
            allocations=allocations,
            released=released,
            borrowed={a: n for a, n in self.borrowed.items() if a != address},
            empty_since=empty_since,
        )

    def pruned(self, now: float, reuse_delay: float) -> BlockRecord:
        """Forget releases whose reuse delay has passed (keeps the record small)."""
        if not self.released or all(now - t < reuse_delay for t in self.released.values()):
            return self
        return replace(
            self, released={a: t for a, t in self.released.items() if now - t < reuse_delay}
        )

    def cooling(self, now: float, reuse_delay: float) -> set[str]:
        """Free addresses still within their reuse delay."""
        return {
            a
            for a, t in self.released.items()
            if now - t < reuse_delay and a not in self.allocations
        }

    def to_bytes(self) -> bytes:
        data = {
            **self.extra,
            "pool": self.pool,
            "cidr": self.cidr,
            "affinity": self.affinity,
            "allocations": dict(self.allocations),
            "last": self.last,
            "claimedAt": self.claimed_at,
        }
        if self.released:
            data["released"] = dict(self.released)
        if self.borrowed:
            data["borrowed"] = dict(self.borrowed)
        if self.empty_since is not None:
            data["emptySince"] = self.empty_since
        return encode(data)

    @cached_property
    def net(self) -> IPNet:
        return ipaddress.ip_network(self.cidr)

    @classmethod
    def from_bytes(cls, key: str, value: bytes) -> BlockRecord:
        return cls.from_dict(key, decode(key, value))

    @classmethod
    def at_key(cls, key: str, value: bytes) -> BlockRecord:
        """The block stored at ``key``: its pool and CIDR are the key's."""
        try:
            pool, cidr = parse_block_key(key)
        except ValueError as exc:
            raise CorruptRecord(f"corrupt IPAM block {key}", f"bad block key: {exc!r}") from None
        return cls.from_dict(key, {**decode(key, value), "pool": pool, "cidr": cidr})

    @classmethod
    def from_dict(cls, key: str, data: Mapping[str, Any]) -> BlockRecord:
        try:
            empty = data.get("emptySince")
            return cls(
                pool=str(data["pool"]),
                cidr=str(data["cidr"]),
                affinity=str(data.get("affinity") or ""),
                allocations={str(a): str(h) for a, h in (data.get("allocations") or {}).items()},
                last=data.get("last"),
                claimed_at=float(data.get("claimedAt") or 0),
                extra={k: v for k, v in data.items() if k not in cls.FIELDS},
                released={str(a): float(t) for a, t in (data.get("released") or {}).items()},
                borrowed={str(a): str(n) for a, n in (data.get("borrowed") or {}).items()},
                empty_since=float(empty) if empty is not None else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptRecord(
                f"corrupt IPAM block {key}", f"bad block record: {exc!r}"
            ) from None


@dataclass(frozen=True)
class LeasedIP:
    address: str  # with the subnet's prefix: "10.22.0.5/16"
    gateway: str | None
    pool: str
    block: str  # the block's CIDR: "10.22.0.0/26"
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    FIELDS = ("address", "gateway", "pool", "block")

    @property
    def ip(self) -> str:
        return self.address.split("/")[0]

    @property
    def block_key(self) -> str:
        return block_key(self.pool, self.block)

    def to_dict(self) -> dict:
        return {
            **self.extra,
            "address": self.address,
            "gateway": self.gateway,
            "pool": self.pool,
            "block": self.block,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LeasedIP:
        return cls(
            str(data["address"]),
            data.get("gateway"),
            str(data["pool"]),
            str(data["block"]),
            {k: v for k, v in data.items() if k not in cls.FIELDS},
        )


@dataclass(frozen=True)
class HandleRecord:
    """The addresses one attachment holds, with who holds them (node, pod)."""

    handle: HandleId
    ips: tuple[LeasedIP, ...]
    attributes: Mapping[str, str] = field(default_factory=dict)
    created_at: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    FIELDS = ("network", "containerID", "ifname", "ips", "attributes", "createdAt")

    @property
    def node(self) -> str:
        return self.attributes.get("node", "")

    def to_bytes(self) -> bytes:
        return encode(
            {
                **self.extra,
                "network": self.handle.network,
                "containerID": self.handle.container_id,
                "ifname": self.handle.ifname,
                "ips": [ip.to_dict() for ip in self.ips],
                "attributes": dict(self.attributes),
                "createdAt": self.created_at,
            }
        )

    @classmethod
    def from_bytes(cls, key: str, value: bytes) -> HandleRecord:
        return cls.from_dict(key, decode(key, value))

    @classmethod
    def from_dict(cls, key: str, data: Mapping[str, Any]) -> HandleRecord:
        try:
            handle = HandleId(str(data["network"]), str(data["containerID"]), str(data["ifname"]))
            ips = tuple(LeasedIP.from_dict(ip) for ip in data.get("ips") or [])
            return cls(
                handle,
                ips,
                {str(k): str(v) for k, v in (data.get("attributes") or {}).items()},
                float(data.get("createdAt") or 0),
                {k: v for k, v in data.items() if k not in cls.FIELDS},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptRecord(
                f"corrupt IPAM handle {key}", f"bad handle record: {exc!r}"
            ) from None


@dataclass(frozen=True)
class AffinityRecord:
    """The value of an affinity index entry: the block a node claimed, and when."""

    pool: str
    cidr: str
    claimed_at: float

    def to_bytes(self) -> bytes:
        return encode({"pool": self.pool, "cidr": self.cidr, "claimedAt": self.claimed_at})
