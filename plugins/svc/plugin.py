"""pycni-svc: publishes a Pod's attachment as a Service endpoint (a chained plugin, in pycnid).

It runs after the main plugin (pycni-bridge or any other) and reads the Pod's addresses from
prevResult; what else it publishes and the shapes it accepts are ``svc_args``'s doc. The
record is ``endpoints/<ns>/<pod>/<ifname>`` (``services.record.EndpointRecord``) and
carries this node and the attachment (network, containerID, ifname) that wrote it.

- ADD: needs prevResult (code 7 naming it); publishes the record and returns prevResult
  unchanged, as a chained plugin must. Repeating it writes nothing.
- DEL: withdraws this attachment's record only (another Pod's under the same name stays),
  needing neither the netns nor prevResult; without the Pod's CNI_ARGS it finds the record by
  attachment. Nothing there is success.
- CHECK: the record is there and says what the request would publish; else code 100 naming
  every field that differs.
- GC: withdraws this node's records of the network whose attachment is not valid.
- STATUS: code 50 while the store cannot serve writes.
A network without pycni-svc never reaches this handler, so it writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cni.spec.errors import CheckFailed, CNIError, InvalidConfig
from cni.spec.request import Request, gc_valid_attachments
from cni.spec.result import canonical
from plugins.base import HandlerDeps
from plugins.svc.args import (
    calc_ips,
    parse_labels,
    parse_port_protocols,
    parse_ports,
    validate_identity,
)
from plugins.svc.store import (
    attachment_of,
    decode_endpoint,
    ensure_published,
    find_keys,
    withdraw_all,
)
from services.record import EndpointRecord, endpoint_key

log = logging.getLogger("pycnid.svc")
COMPARED = ("ips", "labels", "ports", "portProtocols", "node", "containerID", "network")


def calc_record(req: Request, node: str, with_ips: bool = True) -> EndpointRecord:
    """The record this request publishes (ips only ``with_ips``: CHECK may lack prevResult)."""
    namespace, pod = validate_identity(req.env.args)
    labels, ports = parse_labels(req.config, req.env.args), parse_ports(req.config)
    ips = calc_ips(req.prev_result, req.version, req.env.ifname) if with_ips else ()
    return EndpointRecord(
        namespace,
        pod,
        req.env.ifname,
        ips,
        labels,
        node,
        ports,
        req.env.container_id,
        req.network,
        port_protocols=parse_port_protocols(req.config),
    )


def owned_by(req: Request) -> Callable[[EndpointRecord], bool]:
    """True for the record this request's attachment wrote."""
    mine = (req.network, req.env.container_id, req.env.ifname)
    return lambda record: attachment_of(record) == mine


def calc_differences(
    stored: EndpointRecord, wanted: EndpointRecord, fields: tuple[str, ...]
) -> list[str]:
    have, want = stored.to_dict(), wanted.to_dict()
    return [
        f"{name}: the store has {have.get(name)!r}, the request {want.get(name)!r}"
        for name in fields
        if have.get(name) != want.get(name)  # (portProtocols is left out when empty)
    ]


class SvcPlugin:
    def __init__(self, deps: HandlerDeps) -> None:
        self.deps = deps
        self.store = deps.store

    def add(self, req: Request) -> dict:
        if req.prev_result is None:
            raise InvalidConfig(
                "pycni-svc needs prevResult",
                "key 'prevResult' is missing: put pycni-svc after the main plugin in the conflist",
            )
        record = calc_record(req, self.deps.node_name)
        self.deps.faults.point(req, "svc-publish")
        ensure_published(self.store, record)
        if self.deps.netpol is not None:  # isolated before its containers start
            self.deps.netpol.settle(record.key, record.to_bytes())
        return canonical(req.prev_result, req.version)

    def delete(self, req: Request) -> None:
        owned = owned_by(req)
        try:
            namespace, pod = validate_identity(req.env.args)
        except CNIError:  # no Pod identity on this DEL: look for the attachment's record
            keys = find_keys(self.store, owned)
        else:
            keys = [endpoint_key(namespace, pod, req.env.ifname)]
        self.deps.faults.point(req, "svc-withdraw")
        gone = withdraw_all(self.store, keys, owned)
        if gone:
            log.info("DEL withdrew endpoint %s", ", ".join(gone))

    def check(self, req: Request) -> None:
        with_ips = req.prev_result is not None
        wanted = calc_record(req, self.deps.node_name, with_ips)
        kv = self.store.get(wanted.key)
        stored = decode_endpoint(kv) if kv is not None else None
        if stored is None:
            raise CheckFailed(
                f"no endpoint record {wanted.key}",
                "pycni-svc published nothing for this attachment (or it is corrupt): repeat ADD",
            )
        fields = COMPARED if with_ips else COMPARED[1:]
        differences = calc_differences(stored, wanted, fields)
        if differences:
            raise CheckFailed(f"endpoint record {wanted.key} differs", "; ".join(differences))

    def status(self, req: Request) -> None:
        self.store.status()

    def gc(self, req: Request) -> None:
        stale = calc_stale_filter(req, self.deps.node_name)
        gone = withdraw_all(self.store, find_keys(self.store, stale), stale)
        if gone:
            log.info(
                "GC withdrew %d endpoint(s) of %s: %s", len(gone), req.network, ", ".join(gone)
            )

    def close(self) -> None:
        """Nothing of its own: the store is pycnid's to close."""


def calc_stale_filter(req: Request, node: str) -> Callable[[EndpointRecord], bool]:
    """GC: true for this node's records of this network whose attachment is not valid (an
    entry without ifname keeps every ifname of its containerID; no key: nothing is valid)."""
    valid = gc_valid_attachments(req.config) or set()
    any_ifname = {cid for cid, ifname in valid if not ifname}

    def stale(record: EndpointRecord) -> bool:
        if record.node != node or record.network != req.network:
            return False
        return (
            record.container_id,
            record.ifname,
        ) not in valid and record.container_id not in any_ifname

    return stale


def create(deps: HandlerDeps) -> SvcPlugin:
    """pycnid's entry point: publish endpoints in the store pycnid opened."""
    return SvcPlugin(deps)
