"""Writing Services: VIPs and nodePorts allocated and indexed in the Service's own txn.

A Service and its index keys (``serviceips/<ip>``, ``nodeports/<proto>/<port>``, value
"ns/name") are written in one txn that compares every new index key absent, the Service key
at the revision read, and the settings at the revision read: two creates that pick the same
VIP cannot both win, and the loser re-reads and plans again (``run_cas``), picking the next
free one — the same rule as Pod IPs. A change keeps the Service's allocations unless it names
new ones, and re-indexes in the same txn; a removal deletes the index keys with the Service.
Allocation takes the lowest free address of each service CIDR (not its network address, nor
the IPv4 broadcast) and the lowest free nodePort of the range, per protocol; a Service with
externalTrafficPolicy Local on a NodePort or LoadBalancer also gets a healthCheckNodePort,
the lowest free TCP nodePort after its own, indexed as one (``nodeports/TCP/<port>``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TypeGuard, TypeVar

from cni.spec.errors import AddressExhausted, InvalidConfig, TryAgainLater
from services.record import (
    ServicePort,
    ServiceRecord,
    ServiceSettings,
    node_port_key,
    service_ip_key,
)
from services.validate import NODE_PORT_TYPES, validate_service
from store.base import KV, Compare, Delete, Put, Store
from store.cas import LOST, Lost, Retry, run_cas
from store.codec import CorruptRecord
from store.keys import NODE_PORTS, SERVICE_IPS, SERVICES_META

T = TypeVar("T")

RETRY = Retry(attempts=12, base=0.005, cap=0.2, jitter=True, immediate=1)


class ServiceNotFound(InvalidConfig):
    """No Service of that namespace and name."""


class ServiceConflict(InvalidConfig):
    """A Service of that name exists, or a VIP or nodePort it asks for is another's."""


def read_settings(store: Store) -> tuple[ServiceSettings, int]:
    """The cluster's service settings and their revision (refused while never configured)."""
    kv = store.get(SERVICES_META)
    if kv is None:
        raise InvalidConfig(
            "no service settings in the store (meta/services)",
            "set them first: pycni svc config set --cidr CIDR",
        )
    return ServiceSettings.from_bytes(kv.key, kv.value), kv.mod_revision


def not_found(key: str) -> ServiceNotFound:
    return ServiceNotFound(f"no Service {key.rsplit('/', 2)[-2]}/{key.rsplit('/', 1)[-1]}")


def read_service(store: Store, key: str) -> tuple[ServiceRecord, int]:
    kv = store.get(key)
    if kv is None:
        raise not_found(key)
    return ServiceRecord.from_bytes(kv.key, kv.value), kv.mod_revision


def read_index(store: Store, prefix: str) -> dict[str, str]:
    """index key -> the "ns/name" that holds it."""
    return {kv.key: kv.value.decode(errors="replace") for kv in store.range(prefix)}


def iter_hosts(cidr: str) -> Iterator[str]:
    net = ipaddress.ip_network(cidr)
    last = net.broadcast_address if net.version == 4 else None
    for offset in range(1, net.num_addresses):
        ip = net.network_address + offset
        if ip != last:
            yield str(ip)


def calc_vips(record: ServiceRecord, settings: ServiceSettings, held: dict[str, str]) -> tuple:
    """The Service's VIPs: those it has, else the lowest free one of each service CIDR."""
    if record.cluster_ips:
        return record.cluster_ips
    vips = []
    for cidr in settings.cidrs:
        free = next((ip for ip in iter_hosts(cidr) if service_ip_key(ip) not in held), None)
        if free is None:
            raise AddressExhausted(f"no free service IP left in {cidr}")
        vips.append(free)
    return tuple(vips)


def calc_node_ports(
    record: ServiceRecord, settings: ServiceSettings, held: dict[str, str]
) -> tuple[ServicePort, ...]:
    """Each port without a nodePort (on a NodePort or LoadBalancer Service: a LoadBalancer
    implies nodePorts, as in Kubernetes) gets the lowest free one."""
    taken, ports = set(held) | record.index_keys(), []
    low, high = settings.node_port_range
    for port in record.ports:
        if record.type in NODE_PORT_TYPES and not port.node_port:
            free = next(
                (n for n in range(low, high + 1) if node_port_key(port.protocol, n) not in taken),
                None,
            )
            if free is None:
                raise AddressExhausted(f"no free {port.protocol} nodePort left in {low}-{high}")
            port = replace(port, node_port=free)
        taken.add(node_port_key(port.protocol, port.node_port))
        ports.append(port)
    return tuple(ports)


def validate_held(record: ServiceRecord, held: dict[str, str]) -> None:
    """Refuse a VIP or nodePort another Service holds, naming it and its holder."""
    for key in sorted(record.index_keys()):
        owner = held.get(key, record.ref)
        if owner != record.ref:
            what = (
                key.removeprefix(SERVICE_IPS)
                if key.startswith(SERVICE_IPS)
                else "nodePort " + key.removeprefix(NODE_PORTS)
            )
            raise ServiceConflict(f"{what} is held by Service {owner}")


def calc_allocated(
    record: ServiceRecord, settings: ServiceSettings, store: Store
) -> ServiceRecord:
    """The record with its VIPs and nodePorts (what it holds itself counts as free)."""
    held = {**read_index(store, SERVICE_IPS), **read_index(store, NODE_PORTS)}
    validate_held(record, held)
    others = {k: v for k, v in held.items() if v != record.ref}
    done = replace(
        record,
        cluster_ips=calc_vips(record, settings, others),
        ports=calc_node_ports(record, settings, others),
    )
    return replace(done, health_check_node_port=calc_health_check_port(done, settings, others))


def calc_health_check_port(
    record: ServiceRecord, settings: ServiceSettings, held: dict[str, str]
) -> int:
    """The Service's healthCheckNodePort: none unless it wants one (``wants_health_check``),
    the one it has, else the lowest free TCP nodePort of the range (its own nodePorts and
    every other Service's index keys are taken)."""
    if not record.wants_health_check:
        return 0
    if record.health_check_node_port:
        return record.health_check_node_port
    taken = set(held) | record.index_keys()
    low, high = settings.node_port_range
    free = next((n for n in range(low, high + 1) if node_port_key("TCP", n) not in taken), None)
    if free is None:
        raise AddressExhausted(
            f"no free TCP nodePort left in {low}-{high} for healthCheckNodePort"
        )
    return free


def plan_write(
    new: ServiceRecord, old: ServiceRecord | None, revision: int, settings_rev: int
) -> tuple[list, list]:
    """The txn writing ``new`` over ``old`` (read at ``revision``; None: absent)."""
    before = old.index_keys() if old else set()
    added, gone = new.index_keys() - before, before - new.index_keys()
    compares = [
        Compare(new.key, revision),
        Compare(SERVICES_META, settings_rev),
        *(Compare(k, 0) for k in sorted(added)),
    ]
    ops = [
        Put(new.key, new.to_bytes()),
        *(Put(k, new.ref.encode()) for k in sorted(added)),
        *(Delete(k) for k in sorted(gone)),
    ]
    return compares, ops


def commit(store: Store, attempt: Callable[[], T | Lost]) -> T:
    busy = TryAgainLater(
        "the Service could not be written: other writers kept winning", "run the command again"
    )
    return run_cas(attempt, RETRY, busy)


def create_service(store: Store, spec: object) -> ServiceRecord:
    """Write the Service ``spec`` describes, allocating what it leaves out; refused if the
    name exists. The spec is validated against the settings the txn compares."""

    def attempt() -> ServiceRecord | Lost:
        settings, settings_rev = read_settings(store)
        record = validate_service(spec, settings)
        if store.get(record.key) is not None:
            raise ServiceConflict(f"Service {record.ref} exists (change it with pycni svc set)")
        done = calc_allocated(record, settings, store)
        compares, ops = plan_write(done, None, 0, settings_rev)
        return done if store.txn(compares, ops).succeeded else LOST

    return commit(store, attempt)


def update_service(store: Store, key: str, change: Callable[[dict], dict]) -> ServiceRecord:
    """Rewrite a Service with the spec ``change(current spec)``; what it leaves unallocated
    is allocated, what it keeps stays (its index keys untouched)."""

    def attempt() -> ServiceRecord | Lost:
        old, revision = read_service(store, key)
        settings, settings_rev = read_settings(store)
        record = validate_service(change(old.spec()), settings).with_extras_of(old)
        if record.key != key:
            raise InvalidConfig("invalid Service field name: a Service cannot be renamed")
        done = calc_allocated(record, settings, store)
        compares, ops = plan_write(done, old, revision, settings_rev)
        return done if store.txn(compares, ops).succeeded else LOST

    return commit(store, attempt)


def remove_service(store: Store, key: str) -> ServiceRecord:
    """Delete a Service and the index keys it holds, in one txn. An unreadable record goes
    too (it would otherwise be there for good), with every index key naming it."""

    def attempt() -> ServiceRecord | Lost:
        try:
            old, revision = read_service(store, key)
        except CorruptRecord:
            return remove_corrupt(store, key)
        held = [kv for kv in map(store.get, sorted(old.index_keys())) if is_held(kv, old)]
        compares = [Compare(key, revision), *(Compare(kv.key, kv.mod_revision) for kv in held)]
        ops = [Delete(key), *(Delete(kv.key) for kv in held)]
        return old if store.txn(compares, ops).succeeded else LOST

    return commit(store, attempt)


def remove_corrupt(store: Store, key: str) -> ServiceRecord | Lost:
    """The unreadable record at ``key`` and the index keys holding its "ns/name"."""
    kv = store.get(key)
    if kv is None:
        raise not_found(key)
    namespace, name = key.rsplit("/", 2)[-2:]
    ref = f"{namespace}/{name}".encode()
    held = [
        i for prefix in (SERVICE_IPS, NODE_PORTS) for i in store.range(prefix) if i.value == ref
    ]
    compares = [Compare(key, kv.mod_revision), *(Compare(i.key, i.mod_revision) for i in held)]
    ops = [Delete(key), *(Delete(i.key) for i in held)]
    gone = ServiceRecord(namespace, name)
    return gone if store.txn(compares, ops).succeeded else LOST


def is_held(kv: KV | None, record: ServiceRecord) -> TypeGuard[KV]:
    return kv is not None and kv.value == record.ref.encode()
