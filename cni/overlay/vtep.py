"""VTEP addresses: leased from the Pod pools under a handle of the node's own (as Calico's
tunnel address), so no Pod can ever be given one and the reaper frees it with the node.

Handle ``_vtep/<node>/<device>`` with attribute ``node``: repeating the lease after a restart
returns the same addresses, and a dead node's VTEP is released with its other handles.
"""
from __future__ import annotations

from ipam.alloc.selection import Selection
from ipam.leases.service import LeaseService
from ipam.records import VTEP_NETWORK, HandleId


def vtep_handle(node: str, device: str) -> HandleId:
    return HandleId(VTEP_NETWORK, node, device)


def lease_vteps(leases: LeaseService, node: str, device: str,
                pools: tuple[str, ...]) -> tuple[str, ...]:
    """One VTEP address per family of the pools (the named ones, or every pool this node may
    use); the addresses without prefix."""
    record, _ = leases.acquire(vtep_handle(node, device), Selection(VTEP_NETWORK, pools=pools),
                               attributes={"node": node, "purpose": "vtep"})
    return tuple(ip.ip for ip in record.ips)


def release_vteps(leases: LeaseService, node: str, device: str) -> None:
    leases.release(vtep_handle(node, device))
