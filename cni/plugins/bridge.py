"""pycni-bridge: the plugin handler pycnid serves (policy; mechanisms live in cni.net).

pycnid runs in the node netns: the bridge, the host veth ends and the nftables table live
there; the pod is reached through the netns fd the executable sent. Requests arrive
concurrently on worker threads: each thread reuses its node netlink session (the pod
session is per request), bridge set-up is serialised per bridge name (and tolerates EEXIST from other processes), nft changes go through one engine.

- ADD: ``bridge_add`` (named steps, full rollback).
- DEL: by derived names only (host veth, masquerade tag), so it needs neither the pod netns
  nor prevResult, and is idempotent.
- CHECK: ``bridge_check``. STATUS: forwarded to IPAM. GC: host veths and masquerade elements
  of this network whose attachment is not valid any more, then IPAM GC.
"""
from __future__ import annotations

import logging
from typing import Any

from cni.net import link
from cni.net.nft import Nft
from cni.net.session import close_node_sessions, node_session
from cni.spec.errors import CNIError
from cni.spec.request import Request, gc_valid_attachments
from .base import Services
from .bridge_add import ADD_STEPS, run_add
from .bridge_check import run_check
from .bridge_errors import MECHANISM_ERRORS, describe
from .bridge_names import Attachment, tag_in_network, tag_of_alias
from .bridge_node import NodeBridges
from .delegate import delegate
from .masq import Masquerader

log = logging.getLogger("pycnid.bridge")
__all__ = ["ADD_STEPS", "BridgePlugin", "create"]


class BridgePlugin:
    def __init__(self, services: Services, nft: Nft | None = None) -> None:
        self.services = services
        self.masq = Masquerader(nft or Nft())
        self.bridges = NodeBridges()

    def add(self, req: Request) -> dict:
        return run_add(self, req)

    def delete(self, req: Request) -> None:
        att = Attachment.of(req)
        errors: list[str] = []
        try:
            with node_session() as ipr:
                link.delete_link(ipr, att.host_veth)
        except MECHANISM_ERRORS as exc:
            errors.append(f"deleting host veth {att.host_veth}: {describe(exc)}")
        try:
            self.masq.remove(att.tag)
        except MECHANISM_ERRORS as exc:
            errors.append(f"removing masquerade elements of {att.tag}: {describe(exc)}")
        delegate(self.services.plugins, req, "DEL")
        if errors:
            raise CNIError("DEL could not remove everything", "; ".join(errors))

    def check(self, req: Request) -> None:
        run_check(self, req)

    def status(self, req: Request) -> None:
        delegate(self.services.plugins, req, "STATUS")

    def gc(self, req: Request) -> None:
        keep = valid_attachment_filter(req)
        errors = self._collect_veths(keep)
        try:
            errors += self.masq.collect(keep)
        except MECHANISM_ERRORS as exc:
            errors.append(f"reading masquerade elements: {describe(exc)}")
        try:
            delegate(self.services.plugins, req, "GC")
        except CNIError as exc:
            errors.append(f"IPAM GC: {exc}")
        if errors:
            raise CNIError(f"GC of network {req.network} finished with {len(errors)} error(s)",
                           "; ".join(errors))

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


def create(services: Services, config: Any) -> BridgePlugin:
    """pycnid's entry point (called on its main thread, in the node netns)."""
    services.on_shutdown.append(close_node_sessions)
    return BridgePlugin(services)
