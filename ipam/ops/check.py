"""`pycni ipam check`, pure: every inconsistency of one snapshot, and how gc would fix it.

Blocks are the truth of who holds an address; handles are the attachments' view. Findings:

==================  ==============================================================  ==========
kind                what                                                            gc fix
==================  ==============================================================  ==========
duplicate-address   one address listed by two handles (same pool space)            drop it from
                                                                                    the handles
                                                                                    the block
                                                                                    does not name
not-allocated       a handle lists an address its block does not hold for anyone   restore
missing-block       a handle lists an address whose block is gone (pool exists)    restore
wrong-holder        a handle lists an address its block gives to another holder    repoint
                    that does not list it
missing-pool        a handle lists an address of a pool that no longer exists      drop
orphan-allocation   a block holds an address for a handle that is missing or does  free
                    not list it
orphan-handle       a handle with no address, or only addresses of missing pools   delete
orphan-block        a block of a missing pool                                      delete if
                                                                                    empty
missing-affinity    a block whose node has no index entry for it                   put it
stale-affinity      an index entry whose block is gone or another node's           delete it
bad-block           a block that does not fit its pool (outside it, wrong size)    (report)
bad-pool            a pool record that cannot be parsed                            (report)
corrupt-record      a key whose value is not a usable record                       (report)
==================  ==============================================================  ==========

"Same pool space": netconf pools of one network, all cluster pools together (they are routed
cluster-wide), or one missing pool; two networks' netconf pools may reuse a subnet.
Restoring rather than dropping keeps an address a pod may still use from being handed out again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from ipaddress import IPv4Network, IPv6Network
from typing import Any

from ipam.ops.inspect import HandleIP, HandleView, Snapshot
from ipam.records import IPNet
from store.keys import AFFINITY, BLOCKS, block_affinity_key, pool_key


@dataclass(frozen=True)
class Fix:
    """One repair, applied as one CAS txn after a second look at the keys it touches."""

    action: str  # free | repoint | restore | drop | delete-handle | delete-block |
    #              put-affinity | delete-affinity
    ip: str | None = None
    block_key: str | None = None
    handle: str | None = None  # the handle restored/repointed to, dropped from or deleted
    holder: str | None = None  # the holder the block names now (free, repoint)
    pool: str | None = None
    cidr: str | None = None
    node: str | None = None  # the block's node (restore, delete-block, *-affinity)


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str
    key: str
    ip: str | None = None
    handles: tuple[str, ...] = ()
    fixes: tuple[Fix, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "fixes"}
        out["handles"] = list(self.handles)
        out["fixes"] = [{k: v for k, v in asdict(f).items() if v is not None} for f in self.fixes]
        return out


def claim_scope(snap: Snapshot, pool: str) -> str:
    spec = snap.spec(pool)
    if spec is None:
        return f"pool:{pool}"
    return f"network:{spec.network}" if spec.network is not None else "cluster"


def find_problems(snap: Snapshot) -> list[Finding]:
    out = [Finding("corrupt-record", f"{key}: {why}", key) for key, why in snap.corrupt]
    out += [
        Finding("bad-pool", f"pool {v.name}: {v.error}", pool_key(v.name))
        for v in snap.pools.values()
        if v.spec is None
    ]
    out += find_block_problems(snap)
    orphans = {h.id for h in snap.handles.values() if is_orphan_handle(snap, h)}
    out += [
        Finding(
            "orphan-handle",
            f"handle {h} holds no address of any existing pool",
            snap.handles[h].key,
            handles=(h,),
            fixes=(Fix("delete-handle", handle=h),),
        )
        for h in sorted(orphans)
    ]
    out += find_claim_problems(snap, orphans)
    out += find_orphan_allocations(snap)
    out += find_affinity_problems(snap)
    return out


def is_orphan_handle(snap: Snapshot, handle: HandleView) -> bool:
    if handle.is_buffer and not handle.ips:
        return False  # a node's emptied outage buffer is normal
    return all(ip.pool not in snap.pools for ip in handle.ips)


def is_inside(net: IPNet, cidr: IPNet) -> bool:
    if isinstance(net, IPv4Network) and isinstance(cidr, IPv4Network):
        return net.subnet_of(cidr)
    if isinstance(net, IPv6Network) and isinstance(cidr, IPv6Network):
        return net.subnet_of(cidr)
    return False  # of another IP family


def find_block_problems(snap: Snapshot) -> list[Finding]:
    out = []
    for block in sorted(snap.blocks.values(), key=lambda b: b.key):
        spec = snap.spec(block.pool)
        if block.pool not in snap.pools:
            fixes = (
                ()
                if block.allocations
                else (Fix("delete-block", block_key=block.key, node=block.affinity or None),)
            )
            held = f"; it holds {len(block.allocations)} address(es)" if block.allocations else ""
            out.append(
                Finding(
                    "orphan-block",
                    f"block {block.cidr} of missing pool "
                    f"{block.pool} (node {block.affinity}){held}",
                    block.key,
                    fixes=fixes,
                )
            )
        elif spec is not None and not is_inside(block.net, spec.cidr):
            out.append(
                Finding(
                    "bad-block",
                    f"block {block.cidr} is outside pool {block.pool} {spec.cidr}",
                    block.key,
                )
            )
        elif spec is not None and block.net.prefixlen != spec.block_size:
            out.append(
                Finding(
                    "bad-block",
                    f"block {block.cidr} is not a /{spec.block_size} block of pool {block.pool}",
                    block.key,
                )
            )
    return out


def find_claim_problems(snap: Snapshot, orphans: set[str]) -> list[Finding]:
    claims: dict[tuple[str, str], list[tuple[HandleView, HandleIP]]] = {}
    for handle in snap.handles.values():
        if handle.id in orphans:
            continue
        for item in handle.ips:
            claims.setdefault((claim_scope(snap, item.pool), item.ip), []).append((handle, item))
    out = []
    for (_, ip), listed in sorted(claims.items(), key=lambda kv: kv[0]):
        if len({h.id for h, _ in listed}) > 1:
            out.append(duplicate_finding(snap, ip, listed))
        else:
            out += single_claim_findings(snap, *listed[0])
    return out


def holder_in_block(snap: Snapshot, item: HandleIP) -> str | None:
    block = snap.blocks.get(item.block_key)
    return block.allocations.get(item.ip) if block else None


def duplicate_finding(
    snap: Snapshot, ip: str, listed: list[tuple[HandleView, HandleIP]]
) -> Finding:
    named = {h.id for h, item in listed if holder_in_block(snap, item) == h.id}
    ids = tuple(sorted({h.id for h, _ in listed}))
    fixes = (
        tuple(
            Fix("drop", ip=ip, handle=h.id, pool=item.pool, block_key=item.block_key)
            for h, item in sorted(listed, key=lambda x: x[0].id)
            if h.id not in named
        )
        if named
        else ()
    )
    keeper = (
        f"; the block gives it to {', '.join(sorted(named))}"
        if named
        else "; no block names either: fix by hand (pycni ipam release)"
    )
    return Finding(
        "duplicate-address",
        f"{ip} is listed by {len(ids)} handles: {', '.join(ids)}{keeper}",
        listed[0][1].block_key,
        ip=ip,
        handles=ids,
        fixes=fixes,
    )


def single_claim_findings(snap: Snapshot, handle: HandleView, item: HandleIP) -> list[Finding]:
    if item.pool not in snap.pools:
        return [
            Finding(
                "missing-pool",
                f"handle {handle.id} lists {item.ip} of missing pool {item.pool}",
                handle.key,
                ip=item.ip,
                handles=(handle.id,),
                fixes=(
                    Fix(
                        "drop",
                        ip=item.ip,
                        handle=handle.id,
                        pool=item.pool,
                        block_key=item.block_key,
                    ),
                ),
            )
        ]
    block = snap.blocks.get(item.block_key)
    restore = Fix(
        "restore",
        ip=item.ip,
        block_key=item.block_key,
        handle=handle.id,
        pool=item.pool,
        cidr=item.block,
        node=handle.node,
    )
    if block is None:
        return [
            Finding(
                "missing-block",
                f"handle {handle.id} lists {item.ip} but block "
                f"{item.block} of pool {item.pool} does not exist",
                item.block_key,
                ip=item.ip,
                handles=(handle.id,),
                fixes=(restore,),
            )
        ]
    holder = block.allocations.get(item.ip)
    if holder is None:
        return [
            Finding(
                "not-allocated",
                f"handle {handle.id} lists {item.ip} but block {item.block} holds it for nobody",
                item.block_key,
                ip=item.ip,
                handles=(handle.id,),
                fixes=(restore,),
            )
        ]
    if holder != handle.id:
        return [
            Finding(
                "wrong-holder",
                f"handle {handle.id} lists {item.ip} but block {item.block} gives it to {holder}",
                item.block_key,
                ip=item.ip,
                handles=(handle.id, holder),
                fixes=(
                    Fix(
                        "repoint",
                        ip=item.ip,
                        block_key=item.block_key,
                        handle=handle.id,
                        holder=holder,
                    ),
                ),
            )
        ]
    return []


def find_orphan_allocations(snap: Snapshot) -> list[Finding]:
    listed = {(item.block_key, item.ip) for h in snap.handles.values() for item in h.ips}
    out = []
    for block in sorted(snap.blocks.values(), key=lambda b: b.key):
        for ip, holder in sorted(block.allocations.items()):
            if (block.key, ip) in listed:
                continue  # a handle lists it: a claim finding covers any mismatch
            why = "is missing" if holder not in snap.handles else "does not list it"
            out.append(
                Finding(
                    "orphan-allocation",
                    f"block {block.cidr} of pool {block.pool} "
                    f"holds {ip} for {holder}, which {why}",
                    block.key,
                    ip=ip,
                    handles=(holder,),
                    fixes=(Fix("free", ip=ip, block_key=block.key, holder=holder),),
                )
            )
    return out


def find_affinity_problems(snap: Snapshot) -> list[Finding]:
    """The index /pycni/v1/affinity/<node>/<pool>/<block> against the blocks' affinity."""
    out = []
    for block in sorted(snap.blocks.values(), key=lambda b: b.key):
        key = block_affinity_key(block.affinity, block.key) if block.affinity else None
        if key and key not in snap.affinities:
            out.append(
                Finding(
                    "missing-affinity",
                    f"block {block.cidr} of pool {block.pool} "
                    f"is node {block.affinity}'s but not in its "
                    "index",
                    block.key,
                    fixes=(Fix("put-affinity", block_key=block.key, node=block.affinity),),
                )
            )
    for key in sorted(snap.affinities):
        node, _, rest = key[len(AFFINITY) :].partition("/")
        indexed = snap.blocks.get(f"{BLOCKS}{rest}")
        if indexed is None or indexed.affinity != node:
            why = "is gone" if indexed is None else f"is node {indexed.affinity or '(none)'}'s"
            out.append(
                Finding(
                    "stale-affinity",
                    f"index entry of node {node}: block {rest} {why}",
                    key,
                    fixes=(Fix("delete-affinity", block_key=f"{BLOCKS}{rest}", node=node),),
                )
            )
    return out
