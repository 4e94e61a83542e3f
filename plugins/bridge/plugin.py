"""pycni-bridge: the plugin handler pycnid serves (policy; mechanisms live in kernel).

pycnid runs in the node netns: the bridge, the host veth ends and the nftables table live
there; the pod is reached through the netns fd the executable sent. Requests arrive
concurrently on worker threads: each thread reuses its node netlink session (the pod
session is per request), bridge set-up is serialised per bridge name (and tolerates EEXIST
from other processes), masquerade changes go through the table's one writer (``masq/table.py``).

- ADD: ``bridge_add`` (named steps, full rollback); with NetworkPolicy enforced, its last step
  settles the Pod's isolation (``isolation.py``).
- DEL: by derived names only (host veth, masquerade tag), so it needs neither the pod netns
  nor prevResult, and is idempotent; it detaches the Pod's addresses from NetworkPolicy.
- CHECK: ``bridge_check``. STATUS: forwarded to IPAM. GC: host veths and masquerade elements
  of this network whose attachment is not valid any more, then IPAM GC.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cni.spec.errors import CleanupIncomplete, CNIError
from cni.spec.request import Request, gc_valid_attachments
from common.attachment import Attachment, tag_in_network, tag_of_alias
from kernel import link
from kernel.session import close_node_sessions, node_session
from plugins.base import HandlerDeps
from plugins.bridge.add import ADD_STEPS, run_add
from plugins.bridge.check import run_check
from plugins.bridge.context import BridgeContext
from plugins.bridge.delegate import delegate, validate_delegation
from plugins.bridge.errors import MECHANISM_ERRORS, describe
from plugins.bridge.node import NodeBridges

log = logging.getLogger("pycnid.bridge")
__all__ = ["ADD_STEPS", "BridgePlugin", "create"]
DEL_HELPERS = 8  # concurrent veth deletions (they queue on the kernel's rtnl lock anyway)


class BridgePlugin:
    def __init__(self, deps: HandlerDeps) -> None:
        self.ctx = BridgeContext(
            plugins=deps.plugins,  # filled by pycnid once every handler exists
            faults=deps.faults,
            masq=deps.masq,  # the table's one writer, lent by pycnid
            bridges=NodeBridges(),
            overlay=deps.overlay,
            netpol=deps.netpol,
        )
        # Threads are made by the submitting request thread, so they start in the node netns.
        self.helpers = ThreadPoolExecutor(DEL_HELPERS, thread_name_prefix="pycnid-bridge-del")

    def add(self, req: Request) -> dict:
        return run_add(self.ctx, req)

    def delete(self, req: Request) -> None:
        """The kernel spends ~15-20 ms deleting a veth (RCU grace periods), nearly all of it
        waiting: a helper thread deletes it while this one releases the masquerade elements and
        the lease (the reference, too, releases the lease before the veth is gone)."""
        att = Attachment.of(req)
        validate_delegation(self.ctx.plugins, req)  # a bad ipam section removes nothing
        if self.ctx.netpol is not None:
            self.ctx.netpol.detach(att.tag)  # in memory: cannot fail
        veth_removed = self.helpers.submit(remove_host_veth, att.host_veth)
        errors: list[str] = []
        try:
            self.ctx.faults.point(req, "del-masquerade")  # the veth going meanwhile
            try:
                self.ctx.masq.remove(att.tag)
            except MECHANISM_ERRORS as exc:
                errors.append(f"removing masquerade elements of {att.tag}: {describe(exc)}")
            self.ctx.faults.point(req, "del-ipam")
            delegate(self.ctx.plugins, req, "DEL")
        finally:
            veth_error = veth_removed.result()
        self.ctx.faults.point(req, "del-finish")
        errors = ([veth_error] if veth_error else []) + errors
        if errors:
            raise CleanupIncomplete(
                "DEL could not remove everything: repeat DEL", "; ".join(errors)
            )

    def close(self) -> None:
        self.helpers.shutdown(wait=False, cancel_futures=True)
        close_node_sessions()

    def check(self, req: Request) -> None:
        validate_delegation(self.ctx.plugins, req)
        run_check(self.ctx, req)

    def status(self, req: Request) -> None:
        validate_delegation(self.ctx.plugins, req)
        delegate(self.ctx.plugins, req, "STATUS")

    def gc(self, req: Request) -> None:
        validate_delegation(self.ctx.plugins, req)
        keep = valid_attachment_filter(req)
        errors = self._collect_veths(keep)
        try:
            errors += self.ctx.masq.collect(keep)
        except MECHANISM_ERRORS as exc:
            errors.append(f"reading masquerade elements: {describe(exc)}")
        try:
            delegate(self.ctx.plugins, req, "GC")
        except CNIError as exc:
            errors.append(f"IPAM GC: {exc}")
        if errors:
            raise CleanupIncomplete(
                f"GC of network {req.network} finished with {len(errors)} error(s): repeat GC",
                "; ".join(errors),
            )

    def _collect_veths(self, keep: Any) -> list[str]:
        errors = []
        with node_session() as ipr:
            for found in link.list_links(ipr):
                tag = tag_of_alias(found.alias)
                if found.kind != "veth" or tag is None or keep(tag):
                    continue
                try:
                    link.delete_link(ipr, found.name)
                    log.info("GC removed host veth %s (%s)", found.name, tag)
                except MECHANISM_ERRORS as exc:
                    errors.append(f"deleting host veth {found.name} ({tag}): {describe(exc)}")
        return errors


def remove_host_veth(name: str) -> str | None:
    """Delete a host veth (its peer goes along); None when done or already gone, else why not."""
    if not link.link_exists(name):
        return None
    try:
        with node_session() as ipr:
            link.delete_link(ipr, name)
    except MECHANISM_ERRORS as exc:
        return f"deleting host veth {name}: {describe(exc)}"
    return None


def valid_attachment_filter(req: Request) -> Any:
    """GC: a predicate over attachment tags, true for what must be kept: tags of other
    networks and of this network's valid attachments. No valid-attachments key (cnitool's
    gc) means nothing of this network is valid."""
    network = req.network
    valid = gc_valid_attachments(req.config) or set()
    tags = {Attachment(network, cid, ifname).tag for cid, ifname in valid if ifname}
    any_ifname = {cid for cid, ifname in valid if not ifname}

    def keep(tag: str) -> bool:
        if not tag_in_network(tag, network) or tag in tags:
            return True
        parts = tag.split("/")
        return len(parts) == 3 and parts[1] in any_ifname

    return keep


def create(deps: HandlerDeps) -> BridgePlugin:
    """pycnid's entry point (called on its main thread, in the node netns)."""
    return BridgePlugin(deps)
