"""pycni-ipam: leases pod addresses from the node's store (served in pycnid).

Verbs: ADD leases one address per range set to (network, containerID, ifname) and returns the
abbreviated IPAM result (``ips`` without ``interface``, ``routes`` from ``ipam.routes``,
``dns`` from ``ipam.dns``); repeating it returns the same addresses. DEL releases (nothing
held is success). CHECK: the lease exists, its addresses are in their blocks, and they are
the prevResult's. GC: releases this node's leases in the network that are not in
``cni.dev/valid-attachments`` (or ``cni.dev/attachments``); no key at all means nothing is
valid (cnitool's gc). STATUS: 50 when the store is unreachable or a pool set has no address
left for this node.

Addresses come from netconf ranges, cluster pools named in ``ipam.pools``, or the cluster pools
whose node selector matches this node (``ipam_config``). The daemon config adds ``nodeLabels``
(for node selectors) and ``ipam.blockReturnGrace`` / ``ipam.housekeepingInterval`` (seconds:
how long an empty block stays with the node, and how often that is looked at; 0: never). The
housekeeping thread also rolls back failed ADDs whose txn landed after all. pycnid opens the
store and starts those threads at start-up (``pycnid/wiring.py``); the handler only
reads ``HandlerDeps.leases`` and ``HandlerDeps.node``.
"""

from __future__ import annotations

import ipaddress
import logging
from contextlib import ExitStack
from typing import Any

from cni.spec.errors import CheckFailed, CNIError, NotAvailable, TryAgainLater
from cni.spec.request import Request, gc_valid_attachments
from cni.spec.result import canonical
from ipam.alloc.allocator import IPAddr
from ipam.alloc.selection import missing_gateway
from ipam.records import BlockRecord, HandleId, HandleRecord
from plugins.base import HandlerDeps
from plugins.ipam.config import IpamConfig, cached_ipam_config
from plugins.ipam.requested import Requested, parse_requested_ips, requested_by_set
from store.keys import block_key

log = logging.getLogger("pycnid.ipam")
POD_ATTRIBUTES = {"K8S_POD_NAMESPACE": "namespace", "K8S_POD_NAME": "pod", "K8S_POD_UID": "podUID"}


def handle_of(req: Request) -> HandleId:
    return HandleId(req.network, req.env.container_id, req.env.ifname)


def render_result(record: HandleRecord, cfg: IpamConfig) -> dict:
    """The canonical (1.1.0-shaped) abbreviated IPAM result; its routes and dns are copies
    (``cfg`` is shared by every ADD of the netconf)."""
    ips = [
        {"address": ip.address, **({"gateway": ip.gateway} if ip.gateway else {})}
        for ip in record.ips
    ]
    dns = {k: list(v) if isinstance(v, list) else v for k, v in (cfg.dns or {}).items()}
    return {"cniVersion": "1.1.0", "ips": ips, "routes": [dict(r) for r in cfg.routes], "dns": dns}


def require_gateways(record: HandleRecord, cfg: IpamConfig) -> None:
    """With the main plugin's isGateway / isDefaultGateway, every address comes with the
    gateway the IPAM reserved for it (InvalidConfig naming the pool otherwise)."""
    for ip in record.ips:
        if cfg.gateway_key and not ip.gateway:
            raise missing_gateway(ip.pool, ip.ip, cfg.gateway_key)


def pod_attributes(req: Request) -> dict[str, str]:
    return {
        name: req.env.args[arg] for arg, name in POD_ATTRIBUTES.items() if req.env.args.get(arg)
    }


class IpamPlugin:
    def __init__(self, deps: HandlerDeps) -> None:
        self.deps = deps
        self.leases = deps.leases
        self.node = deps.node  # liveness, outage guard, reaper (nodes/context.py)
        self.guard = deps.node.guard

    def add(self, req: Request) -> dict:
        cfg = cached_ipam_config(req.config)  # validated once per distinct netconf
        requested: tuple[Requested, ...] | dict[int, IPAddr]
        requested = parse_requested_ips(req.config, req.env.args)
        if cfg.range_sets:  # cluster pools map requests once the pools are read
            requested = requested_by_set(cfg, requested)
        handle = handle_of(req)
        with ExitStack() as undo:
            self.deps.faults.point(req, "ipam-allocate")
            attributes = pod_attributes(req)
            record, created = self.guard.acquire(  # the outage buffer when etcd is away
                handle,
                cfg.selection,
                attributes,
                lambda: self.leases.acquire(handle, cfg.selection, requested, attributes),
                static=bool(requested),
            )
            if created:
                undo.callback(self._rollback, handle)
            require_gateways(record, cfg)  # the outage buffer's and older leases too
            self.deps.faults.point(req, "ipam-result")
            result = render_result(record, cfg)
            undo.pop_all()
        return result

    def _rollback(self, handle: HandleId) -> None:
        try:
            self.guard.release(handle, lambda: self.leases.release(handle))
        except CNIError as err:  # the runtime's DEL (or GC) releases it later
            log.warning("could not roll back the lease of %s: %s", handle, err)

    def delete(self, req: Request) -> None:
        handle = handle_of(req)
        self.deps.faults.point(req, "ipam-release")
        self.guard.release(handle, lambda: self.leases.release(handle))
        self.deps.faults.point(req, "ipam-released")

    def check(self, req: Request) -> None:
        handle = handle_of(req)
        served = self.guard.lookup(handle)  # served from the outage buffer, not written back
        if served is not None:
            if req.prev_result is not None:
                compare_with_prev_result(served, req.prev_result, req.version)
            return
        record = self.leases.lookup(handle)
        if record is None:
            raise CheckFailed(
                f"no address lease for {handle}",
                "the attachment holds no address in the IPAM store",
            )
        for ip in record.ips:
            self._check_block(record, ip.pool, ip.block, ip.ip)
        if req.prev_result is not None:
            compare_with_prev_result(record, req.prev_result, req.version)

    def _check_block(self, record: HandleRecord, pool: str, cidr: str, ip: str) -> None:
        kv = self.leases.store.get(block_key(pool, cidr))
        holder = BlockRecord.from_bytes(kv.key, kv.value).allocations.get(ip) if kv else None
        if holder != str(record.handle):
            raise CheckFailed(
                f"address {ip} of {record.handle} is not allocated to it",
                f"block {cidr} of pool {pool} records holder {holder!r}",
            )

    def status(self, req: Request) -> None:
        try:
            self.leases.store.status()
            cfg = cached_ipam_config(req.config)
            self.leases.ensure_capacity(cfg.selection)
        except TryAgainLater as err:
            raise NotAvailable(err.msg, err.details) from None

    def gc(self, req: Request) -> None:
        valid = gc_valid_attachments(req.config)
        released = self.leases.collect_garbage(req.network, valid)
        self.guard.forget(released)
        if released:
            log.info(
                "GC released %d lease(s) in %s: %s",
                len(released),
                req.network,
                ", ".join(str(h) for h in released),
            )
        self.node.reap()  # dead nodes' addresses, after their grace period (nodes/reaper.py)

    def close(self) -> None:
        """Nothing of its own: the store and the node's loops are pycnid's to stop."""


def compare_with_prev_result(record: HandleRecord, prev: Any, version: str) -> None:
    """CheckFailed naming every address the lease and prevResult disagree on."""
    result = canonical(prev, version)
    expected = {str(ipaddress.ip_interface(ip["address"]).ip) for ip in result["ips"]}
    held = {ip.ip for ip in record.ips}
    if expected != held:
        details = []
        if expected - held:
            details.append(
                f"prevResult lists {', '.join(sorted(expected - held))} "
                "which the lease does not hold"
            )
        if held - expected:
            details.append(
                f"the lease holds {', '.join(sorted(held - expected))} "
                "which prevResult does not list"
            )
        raise CheckFailed(
            f"the addresses of {record.handle} differ from prevResult", "; ".join(details)
        )


def create(deps: HandlerDeps) -> IpamPlugin:
    """pycnid's entry point: serve IPAM from the store and lease service it opened."""
    return IpamPlugin(deps)
