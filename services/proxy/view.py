"""The store's Service records as the proxy's model for one node and one family (pure).

``Records`` is what the proxy keeps from the store (services, endpoints, cluster pools, service
settings, node records), fed by watch events or a re-read; ``calc_model`` turns it into the
``ProxyModel`` the renderer and the tracer read. The proxy in pycnid and ``pycni svc trace``
both call ``calc_model``, so the tracer explains the very table a node programs. A record that
cannot be read, or a Service the model refuses, is skipped (and logged once by the caller's
``Records``): one bad record must not take every other Service down.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import socket
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cni.spec.errors import CNIError
from common.skipped import Skipped
from nodes.record import NodeRecord
from services.proxy.config import DEFAULT_PROXY_CONFIG, ProxyConfig
from services.proxy.model import (
    LOOPBACK,
    Backend,
    IPAddress,
    NodeView,
    ProxyModel,
    ProxyPort,
    ProxyService,
    ServicePortView,
    TextIPv4Address,
    TextIPv6Address,
    new_tuple,
)
from services.record import EndpointRecord, ServiceRecord, ServiceSettings
from services.selectors import calc_served_ports, matches
from store.base import KV
from store.codec import CorruptRecord, decode
from store.keys import ENDPOINTS, NODES, POOLS, SERVICES, SERVICES_META

log = logging.getLogger("pycnid.proxy")
PREFIXES = (SERVICES, ENDPOINTS, POOLS, SERVICES_META, NODES)
EXTERNAL_TYPES = ("NodePort", "LoadBalancer")


LabelKey = tuple[str, str, str]  # (namespace, label, value)
Keys = tuple[str, ...] | set[str]  # an index entry: see _index
SMALL = 8


@dataclass
class Records:
    """The store's records the proxy reads, by key, with two indexes so that a change costs
    what it touches: endpoints by label (a selector's endpoints are an intersection, not a
    scan) and Services by selector pair (an endpoint's change dirties only the Services that
    select it). ``dirty`` collects the Service keys whose views may have changed."""

    services: dict[str, ServiceRecord] = field(default_factory=dict)
    endpoints: dict[str, EndpointRecord] = field(default_factory=dict)
    pools: dict[str, str] = field(default_factory=dict)  # cluster pool key -> CIDR
    settings: ServiceSettings | None = None
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    bad: Skipped = field(default_factory=lambda: Skipped("proxy", log))
    labelled: dict[LabelKey, Keys] = field(default_factory=dict)  # -> endpoint keys
    selecting: dict[LabelKey, Keys] = field(default_factory=dict)  # -> Service keys
    addresses: dict[str, tuple[IPAddress, ...]] = field(default_factory=dict)  # endpoint key ->
    dirty: set[str] = field(default_factory=set)
    vips: Counter = field(default_factory=Counter)  # family -> ClusterIPs of that family

    def apply(self, kv: KV, deleted: bool = False) -> None:
        """One put or delete (an unreadable record is logged once and left out)."""
        try:
            self._apply(kv, deleted)
            self.bad.clear(kv.key)
        except (CorruptRecord, ValueError) as exc:
            self._forget(kv.key)
            self.bad.note(kv.key, exc)

    def _apply(self, kv: KV, deleted: bool) -> None:
        if deleted:
            return self._forget(kv.key)
        if kv.key.startswith(SERVICES):
            self._put_service(kv.key, ServiceRecord.from_bytes(kv.key, kv.value))
        elif kv.key.startswith(ENDPOINTS):
            self._put_endpoint(kv.key, EndpointRecord.from_bytes(kv.key, kv.value))
        elif kv.key.startswith(POOLS):
            self._apply_pool(kv)
        elif kv.key == SERVICES_META:
            self.settings = ServiceSettings.from_bytes(kv.key, kv.value)
        elif kv.key.startswith(NODES):
            self.nodes[kv.key[len(NODES) :]] = NodeRecord.from_bytes(kv.key, kv.value)

    def put_service(self, key: str, record: ServiceRecord | None) -> None:
        """A Service by key (None: gone), from the store or another source."""
        self._put_service(key, record)

    def put_endpoint(
        self,
        key: str,
        record: EndpointRecord | None,
        addresses: tuple[IPAddress, ...] | None = None,
    ) -> None:
        """An endpoint by key (None: gone); its addresses must parse (``parse_address``).
        ``addresses``: its ips already parsed by the caller (None: parsed here)."""
        self._put_endpoint(key, record, addresses)

    def _put_service(self, key: str, record: ServiceRecord | None) -> None:
        old = self.services.pop(key, None)
        if old is not None:
            _unindex(self.selecting, _pairs(old.namespace, old.selector), key)
            self.vips.subtract(_families(old.cluster_ips))
        if record is not None:
            self.services[key] = record
            _index(self.selecting, _pairs(record.namespace, record.selector), key)
            self.vips.update(_families(record.cluster_ips))
        if old != record:
            self.dirty.add(key)

    def _put_endpoint(
        self,
        key: str,
        record: EndpointRecord | None,
        addresses: tuple[IPAddress, ...] | None = None,
    ) -> None:
        """Addresses are parsed here, once per record (unless the caller did): a bad one
        makes the record unreadable (``apply`` leaves it out), and a full render does not
        parse 50k of them again."""
        if record is None:
            addresses = ()
        elif addresses is None:
            addresses = tuple(map(parse_address, record.ips))
        old = self.endpoints.pop(key, None)
        self.addresses.pop(key, None)
        old_pairs = _pairs(old.namespace, old.labels) if old is not None else []
        pairs = _pairs(record.namespace, record.labels) if record is not None else []
        if old is not None:
            _unindex(self.labelled, old_pairs, key)
        if record is not None:
            self.endpoints[key], self.addresses[key] = record, addresses
            _index(self.labelled, pairs, key)
        if old != record:
            self.dirty |= self._selecting(old, old_pairs)
            self.dirty |= self._selecting(record, pairs)

    def _selecting(self, endpoint: EndpointRecord | None, pairs: list[LabelKey]) -> set[str]:
        """The Services whose selector picks ``endpoint`` (``pairs``: its label pairs). A
        selector that is the endpoint's labels (``shared_labels``) picks it without a look."""
        found: set[str] = set()
        if endpoint is None:
            return found
        labels = endpoint.labels
        for pair in pairs:
            for key in self.selecting.get(pair, ()):
                selector = self.services[key].selector
                if selector is labels or matches(selector, labels):
                    found.add(key)
        return found

    def selected(self, service: ServiceRecord) -> list[tuple[EndpointRecord, tuple]]:
        """The endpoints ``service``'s selector picks, by key (an index intersection), each
        with its parsed addresses."""
        pairs = _pairs(service.namespace, service.selector)
        if not pairs:
            return []
        first = self.labelled.get(pairs[0], ())
        if len(pairs) == 1 and isinstance(first, tuple):
            keys: Iterable[str] = first  # a small entry is a sorted tuple (_index)
        else:
            keys = sorted(set(first).intersection(*(self.labelled.get(p, ()) for p in pairs[1:])))
        endpoints, addresses = self.endpoints, self.addresses
        return [(endpoints[k], addresses[k]) for k in keys]

    def _apply_pool(self, kv: KV) -> None:
        """A cluster pool's CIDR; a pool a netconf defined is not the cluster's."""
        record = decode(kv.key, kv.value)
        self.pools.pop(kv.key, None)
        if record.get("source") != "netconf" and record.get("cidr"):
            self.pools[kv.key] = str(ipaddress.ip_network(str(record["cidr"])))

    def _forget(self, key: str) -> None:
        if key in self.services:
            self._put_service(key, None)
        if key in self.endpoints:
            self._put_endpoint(key, None)
        self.pools.pop(key, None)
        if key == SERVICES_META:
            self.settings = None
        if key.startswith(NODES):
            self.nodes.pop(key[len(NODES) :], None)

    def replace_all(self, kvs: Iterable[KV], prefix: str) -> None:
        """A snapshot of one prefix replaces what was known under it; a record that did not
        change dirties nothing (a whole read at start or after a lost watch). ``kvs`` is consumed
        once, as it comes (etcd's pages), and the keys it lacks are forgotten after."""
        present: set[str] = set()
        for kv in kvs:
            present.add(kv.key)
            self.apply(kv)
        known = [k for table in (self.services, self.endpoints, self.pools) for k in table]
        for key in [k for k in known if k.startswith(prefix) and k not in present]:
            self._forget(key)
        self.bad.keep_only(prefix, present)
        if prefix == SERVICES_META and SERVICES_META not in present:
            self.settings = None
        if prefix == NODES:
            self.nodes = {k: v for k, v in self.nodes.items() if NODES + k in present}

    def wants(self, family: int) -> bool:
        """A family's table is made once a service CIDR or a ClusterIP of it exists (known
        without building any view: a family without a table is asked on every pass)."""
        cidrs = self.settings.cidrs if self.settings else ()
        return self.vips[family] > 0 or any(_family_of(c) == family for c in cidrs)

    def take_dirty(self) -> set[str]:
        """The Service keys changed since the last call (and forget them)."""
        dirty, self.dirty = self.dirty, set()
        return dirty


def _family_of(text: str) -> int:
    return 6 if ":" in text else 4


def _families(ips: Iterable[str]) -> list[int]:
    return [_family_of(ip) for ip in ips]


def _pairs(namespace: str, labels: Mapping[str, str]) -> list[LabelKey]:
    return [(namespace, k, v) for k, v in labels.items()]


def _index(index: dict[LabelKey, Keys], pairs: Iterable[LabelKey], key: str) -> None:
    """Add ``key`` under each pair. An entry of up to ``SMALL`` keys is a sorted tuple, a
    larger one a set (one form for each size, whatever the order of changes): most label
    pairs pick a few endpoints and one Service, and a set of 5 keys is 472 bytes, its tuple
    80 (the two indexes were ~10 MiB at 10k Services x 5 endpoints)."""
    for pair in pairs:
        held = index.get(pair, ())
        if key in held:
            continue
        if isinstance(held, set):
            held.add(key)
        elif len(held) < SMALL:
            index[pair] = tuple(sorted((*held, key)))
        else:
            index[pair] = {*held, key}


def _unindex(index: dict[LabelKey, Keys], pairs: Iterable[LabelKey], key: str) -> None:
    for pair in pairs:
        held = index.get(pair)
        if held is None or key not in held:
            continue
        if isinstance(held, set):
            held.discard(key)
            rest: Keys = held if len(held) > SMALL else tuple(sorted(held))
        else:
            rest = tuple(k for k in held if k != key)
        if rest:
            index[pair] = rest
        else:
            del index[pair]


def calc_node_ips(
    family: int, record_address: str, local: Iterable[str], cluster_cidrs: Iterable[str]
) -> tuple[IPAddress, ...]:
    """Where NodePorts answer: the node record's address and the node's other addresses of
    ``family``, never loopback, link-local nor a Pod pool's (a bridge gateway is no node IP)."""
    pools = [ipaddress.ip_network(c) for c in cluster_cidrs]
    found = set()
    for text in (record_address, *local):
        try:
            ip = ipaddress.ip_address(text.split("/")[0]) if text else None
        except ValueError:
            continue
        if ip is None or ip.version != family or ip in LOOPBACK[family] or ip.is_link_local:
            continue
        if not any(ip in p for p in pools if p.version == family):
            found.add(ip)
    return tuple(sorted(found))


def calc_node_view(
    records: Records,
    node: str,
    family: int,
    local: Iterable[str] = (),
    config: ProxyConfig = DEFAULT_PROXY_CONFIG,
) -> NodeView:
    """The node's view under its proxy's ``config`` (nodePortAddresses: the record's address
    only, or the addresses inside the CIDRs; masqueradeAll; detectLocalMode)."""
    record = records.nodes.get(node)
    pools = sorted(set(records.pools.values()))
    cidrs = records.settings.cidrs if records.settings else ()
    node_ips = calc_node_ips(
        family, record.address if record else "", () if config.node_port_primary else local, pools
    )
    if config.node_port_cidrs is not None:
        node_ips = tuple(ip for ip in node_ips if any(ip in n for n in config.node_port_cidrs))
    return NodeView(
        node,
        node_ips,
        _nets(pools, family),
        _nets(cidrs, family),
        config.masquerade_all,
        config.local_bridge,
    )


def _nets(cidrs: Iterable[str], family: int) -> tuple:
    nets = {ipaddress.ip_network(c) for c in cidrs}
    return tuple(sorted(n for n in nets if n.version == family))


def calc_model(
    records: Records,
    node: str,
    family: int,
    local: Iterable[str] = (),
    config: ProxyConfig = DEFAULT_PROXY_CONFIG,
) -> ProxyModel:
    """The table ``node`` programs for ``family`` (``local``: its own addresses, if known;
    ``config``: its proxy's settings)."""
    views = [
        v
        for key in sorted(records.services)
        for v in calc_service_views(records, key, node, family)
    ]
    return ProxyModel(family, calc_node_view(records, node, family, local, config), tuple(views))


def calc_changes(
    records: Records,
    node: str,
    family: int,
    local: Iterable[str],
    keys: Iterable[str],
    config: ProxyConfig = DEFAULT_PROXY_CONFIG,
) -> tuple[NodeView, dict[str, tuple[ServicePortView, ...]]]:
    """What a sync hands the table: the node's view and the views of Services ``keys``
    (the dirty ones, or every Service for a full render; ``()`` for one that is gone)."""
    return (
        calc_node_view(records, node, family, local, config),
        {key: calc_service_views(records, key, node, family) for key in keys},
    )


def calc_service_views(
    records: Records, key: str, node: str, family: int
) -> tuple[ServicePortView, ...]:
    """One Service's port views for ``family`` (none: gone, no VIP of it, or refused)."""
    record = records.services.get(key)
    if record is None:
        return ()
    try:
        return tuple(calc_port_views(record, records.selected(record), node, family))
    except (CNIError, ValueError) as exc:
        log.warning("proxy: Service %s left out: %s", key, exc)
        return ()


def calc_service(record: ServiceRecord, family: int) -> ProxyService:
    external = record.type in EXTERNAL_TYPES
    ports = tuple(
        [
            _proxy_port(p.name, p.protocol, p.port, p.node_port if external else None)
            for p in record.ports
        ]
    )
    timeout = record.timeout_seconds if record.session_affinity == "ClientIP" else None
    balanced = record.type == "LoadBalancer"
    return ProxyService(
        record.namespace,
        record.name,
        _ips(record.cluster_ips, family),
        _ips(record.external_ips, family),
        ports,
        timeout,
        record.external_traffic_policy == "Local",
        record.internal_traffic_policy == "Local",
        load_balancer_ips=_ips(record.load_balancer_ips, family) if balanced else (),
        source_ranges=_nets(record.load_balancer_source_ranges, family) if balanced else (),
    )


@functools.lru_cache(maxsize=4096)
def _proxy_port(name: str, protocol: str, port: int, node_port: int | None) -> ProxyPort:
    """One port as the proxy sees it, made once per distinct port (Services share most of
    theirs: 80/TCP, 443/TCP), not per Service and render."""
    return ProxyPort(name, protocol.lower(), port, node_port or None)


def _ips(texts: Iterable[str], family: int) -> tuple[IPAddress, ...]:
    """Addresses of ``family`` (an endpoint's may carry its prefix length)."""
    return tuple([ip for ip in map(_parse_ip, texts) if ip.version == family])


def parse_address(text: str) -> IPAddress:
    """Parsing is most of a full render's model cost (50k endpoint addresses at 10k Services),
    so it is done by the C parser (``inet_pton``, which takes exactly the forms ``ipaddress``
    does, scope ids aside), and an endpoint's addresses once, when its record arrives."""
    addr = text.split("/")[0]
    v6 = ":" in addr
    try:
        packed = socket.inet_pton(socket.AF_INET6 if v6 else socket.AF_INET, addr)
    except OSError:
        raise ValueError(f"{addr!r} is not an IP address") from None
    # its own class: ip_address() would try IPv4 first, 1.6 us for each IPv6 address
    ip = TextIPv6Address(packed) if v6 else TextIPv4Address(packed)
    text = socket.inet_ntop(socket.AF_INET6 if v6 else socket.AF_INET, packed)
    ip.text = addr if text == addr else text  # the record's own string when it is nft's
    return ip


#: A Service's addresses, parsed on every view of it, once while they stay in use (the
#: endpoints' are kept with their records: cached too, they had held ~4 MiB at 10k Services).
_parse_ip = functools.lru_cache(maxsize=1 << 16)(parse_address)


def calc_fixed_ports(record: ServiceRecord) -> dict[str, int] | None:
    """{port label: targetPort} when no targetPort is a name (None otherwise)."""
    fixed: dict[str, int] = {}
    for p in record.ports:
        if isinstance(p.target_port, str):
            return None
        fixed[p.name or str(p.port)] = p.target_port
    return fixed


class ServedPorts:
    """``calc_served_ports`` of a Service's endpoints, once per distinct named-ports mapping
    (it reads nothing else of an endpoint): the endpoints of an EndpointSlice share one
    (``shared_ports``), and numeric targetPorts give the same for every endpoint."""

    def __init__(self, record: ServiceRecord) -> None:
        self.record, self.fixed = record, calc_fixed_ports(record)
        self.by_ports: dict[int, dict[str, int]] = {}  # id(endpoint.ports) -> served

    def of(self, endpoint: EndpointRecord) -> dict[str, int]:
        if self.fixed is not None:
            return self.fixed
        served = self.by_ports.get(id(endpoint.ports))
        if served is None:
            served = self.by_ports[id(endpoint.ports)] = calc_served_ports(self.record, endpoint)
        return served


def calc_port_views(
    record: ServiceRecord,
    endpoints: list[tuple[EndpointRecord, tuple[IPAddress, ...]]],
    node: str,
    family: int,
) -> list[ServicePortView]:
    """One view per port of a Service with a VIP of ``family`` (none: not in this table);
    ``endpoints`` are those its selector picks (``Records.selected``), with their addresses.
    Only usable endpoints become backends (ready, or serving while terminating: a not-ready
    one that is not terminating takes nothing), each with its readiness."""
    service = calc_service(record, family)
    if not service.vips:
        return []
    served = ServedPorts(record)
    picked = [
        (e, [ip for ip in ips if ip.version == family], served.of(e))
        for e, ips in endpoints
        if e.usable
    ]
    views = []
    for port, spec in zip(service.ports, record.ports, strict=True):
        label = spec.name or str(spec.port)
        found = {
            (int(ip), ports[label], e.node): (ip, e.ready)
            for e, ips, ports in picked
            if label in ports
            for ip in ips
        }
        # each address and port once, in address order, the last node's when two claim it
        # (what ServicePortView's own check keeps)
        chosen: dict[tuple[int, int], Backend] = {}
        for (number, p, n), (ip, ready) in sorted(found.items()):
            chosen[number, p] = new_tuple(Backend, (ip, p, n, n == node, ready))
        views.append(ServicePortView.of_unique(service, port, tuple(chosen.values())))
    return views
