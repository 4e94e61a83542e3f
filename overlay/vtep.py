"""VTEP addresses: leased from the Pod pools under handles of the node's own (as Calico's
tunnel address), so no Pod can ever be given one and the reaper frees them with the node.

One handle per family, ``_vtep/<node>/<device>.v4`` and ``….v6`` with attribute ``node``:
repeating a lease after a restart returns the same address, a pool of a family added later
(dual-stack after the fact) gets its VTEP on the next pass without touching the other one, and
a dead node's VTEPs are released with its other handles. The pools are the configured
``vtepPools`` or, as for Pods, every enabled cluster pool whose nodeSelector matches the node.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from cni.spec.errors import CNIError
from ipam.alloc.pool_spec import spec_from_record
from ipam.alloc.selection import Selection, matches
from ipam.leases.service import LeaseService
from ipam.records import HandleId
from store.base import Store
from store.codec import decode
from store.keys import POOLS, VTEP_NETWORK


def vtep_handle(node: str, device: str, version: int) -> HandleId:
    return HandleId(VTEP_NETWORK, node, f"{device}.v{version}")


def pools_by_family(
    store: Store, configured: tuple[str, ...], labels: Mapping[str, str]
) -> dict[int, tuple[str, ...]]:
    """Family -> the pools a VTEP of that family may come from (the named ones in their order,
    else the cluster pools selecting this node, by name)."""
    specs = {}
    for kv in store.range(POOLS):
        try:
            record = decode(kv.key, kv.value)
            spec = spec_from_record(record)
        except CNIError:
            continue
        if record.get("source") != "netconf":
            specs[spec.name] = spec
    names = configured or tuple(
        sorted(n for n, s in specs.items() if not s.disabled and matches(s.node_selector, labels))
    )
    out: dict[int, tuple[str, ...]] = {}
    for name in names:
        if name in specs:
            version = specs[name].cidr.version
            out[version] = out.get(version, ()) + (name,)
    return out


def lease_vteps(
    leases: LeaseService,
    store: Store,
    node: str,
    device: str,
    configured: tuple[str, ...],
    have: tuple[str, ...],
) -> tuple[str, ...]:
    """``have`` plus a VTEP address for every family a pool offers and ``have`` lacks."""
    families = {ipaddress.ip_address(v).version for v in have}
    out = list(have)
    for version, pools in sorted(pools_by_family(store, configured, leases.labels).items()):
        if version in families:
            continue
        record, _ = leases.acquire(
            vtep_handle(node, device, version),
            Selection(VTEP_NETWORK, pools=pools),
            attributes={"node": node, "purpose": "vtep"},
        )
        out += [ip.ip for ip in record.ips]
    return tuple(sorted(out, key=lambda v: ipaddress.ip_address(v).version))


def release_vteps(leases: LeaseService, node: str, device: str) -> None:
    for version in (4, 6):
        leases.release(vtep_handle(node, device, version))
