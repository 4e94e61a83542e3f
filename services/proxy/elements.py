"""A model's map and set elements and the shapes (shared chains) they point at (pure).

Per Service: ``calc_service_parts`` is what ``table.py`` keeps for each Service and diffs when
it changes. A full render (``calc_full_render``: at start, every resync, after a failed
transaction) rewrites the static chains and flushes every data map, but not the ``clients``
set: a resync keeps clients' affinity. A full render of 10k Services is ~70k elements, so the
per-element work here is kept to building tuples and strings (addresses are formatted once).
"""

from __future__ import annotations

import functools
import ipaddress
import operator
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from kernel.nftelem import ElementBatch, ElementChange, render_script
from services.proxy.model import (
    Backend,
    IPAddress,
    IPNetwork,
    NodeView,
    ProxyModel,
    ServicePortView,
    new_tuple,
)
from services.proxy.render import (
    DATA_MAPS,
    DATA_SETS,
    FAMILY,
    TABLE,
    AffinityChain,
    AnyShape,
    Element,
    Shape,
    backends_map,
    calc_affinity_chain_name,
    calc_chain_key,
    calc_clients_key,
    calc_element_types,
    calc_sticky_elements,
    render_shape,
    render_skeleton,
)

REJECT, DROP = "goto reject-chain", "drop"


def calc_entries(view: ServicePortView, model: ProxyModel) -> list[tuple[str, str, bool]]:
    """(entry kind, nft key, external?) of every way a packet reaches this service port:
    ClusterIPs, externalIPs and load balancer IPs (an address given as both is one entry),
    the nodePort."""
    proto, port, svc = view.port.protocol, view.port.port, view.service
    entries = [
        ("vip", f"{_text(ip)} . {proto} . {port}", False) for ip in _family(svc.vips, model)
    ]
    external = dict.fromkeys(_family((*svc.external_ips, *svc.load_balancer_ips), model))
    entries += [("vip", f"{_text(ip)} . {proto} . {port}", True) for ip in external]
    if view.port.node_port is not None and model.node.node_ips:
        entries.append(("np", f"{proto} . {view.port.node_port}", True))
    return entries


def _family(ips: Iterable, model: ProxyModel) -> list:
    return [ip for ip in ips if ip.version == model.family]


def _text(ip: IPAddress) -> str:
    """An address as nft text: the text it was parsed with (``TextIPv4Address``), else by the
    C formatter (``str()`` formats in Python and was the costliest step per element)."""
    try:
        return ip.text  # type: ignore[union-attr]
    except AttributeError:
        return socket.inet_ntop(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, ip.packed)


def calc_shape(
    view: ServicePortView, entry: str, local: bool, backends: tuple[Backend, ...]
) -> AnyShape:
    """The chain an entry with ``backends`` goes to: its shape's, or under ClientIP affinity
    its port's (the Local twin when ``local``: its policy keeps to local endpoints)."""
    timeout = view.service.affinity_timeout
    if not timeout:
        return Shape(entry, "lb", len(backends))
    return calc_affinity_chain(view, local, timeout, backends)


def calc_affinity_chain(
    view: ServicePortView, local: bool, timeout: int, backends: tuple[Backend, ...]
) -> AffinityChain:
    """One affinity port's chain: every entry of the port shares its endpoints' sets, so a
    client keeps its endpoint whichever address of the Service it connects to (a Pod
    short-circuited past a Local policy too: it goes to the port's chain of every endpoint)."""
    svc, port = view.service, view.port
    chosen = tuple(
        (
            text := _text(b.ip),
            b.port,
            calc_clients_key(svc.namespace, svc.name, port.protocol, port.port, text, b.port),
        )
        for b in backends
    )
    chain = calc_affinity_chain_name(svc.namespace, svc.name, port.protocol, port.port, local)
    return AffinityChain(chain, port.protocol, timeout, chosen, calc_chain_key(chain))


def calc_port_parts(
    view: ServicePortView, model: ProxyModel
) -> tuple[list[Element], set[AnyShape]]:
    """Every element one service port contributes (dispatch, backends, masquerade, checks;
    an affinity chain's endpoints once, whichever entries share it) and the shapes its
    dispatch elements point at."""
    elements: list[Element] = []
    shapes: set[AnyShape] = set()
    for entry, key, external in calc_entries(view, model):
        backends = view.calc_backends(external)
        if external and not view.service.external_local:
            elements.append(Element(MASQ_SET[entry], key))
        if view.is_short_circuit(external):
            short_elements, short_shapes = _short_circuit_parts(view, entry, key)
            elements += short_elements
            shapes |= short_shapes
        if not backends:
            verdict = DROP if view.backends and view.is_local_policy(external) else REJECT
            elements.append(Element(NO_ENDPOINTS[entry], key, verdict))
            continue
        shape = calc_shape(view, entry, view.is_local_policy(external), backends)
        shapes.add(shape)
        elements += _dispatch_elements(view, entry, key, shape, backends)
    for shape in shapes:
        if isinstance(shape, AffinityChain):
            elements += calc_sticky_elements(shape)
    return elements, shapes


def _short_circuit_parts(
    view: ServicePortView, entry: str, key: str
) -> tuple[list[Element], set[AnyShape]]:
    """The second dispatch of a Local-policy external entry, for clients in the cluster (the
    ``services`` chain sends Pods and the node there first): every backend."""
    kind, backends = SHORT_CIRCUIT[entry], view.calc_backends(True, in_cluster=True)
    shape = calc_shape(view, kind, False, backends)
    return _dispatch_elements(view, kind, key, shape, backends), {shape}


MASQ_SET = {"vip": "external-masq", "np": "nodeport-masq"}  # ClusterIPs: @service-vips
NO_ENDPOINTS = {"vip": "no-endpoints", "np": "no-endpoint-nodeports"}
DISPATCH = {
    "vip": "service-ips",
    "np": "service-nodeports",
    "sc-vip": "sc-service-ips",
    "sc-np": "sc-service-nodeports",
}
SHORT_CIRCUIT = {"vip": "sc-vip", "np": "sc-np"}


def _dispatch_elements(
    view: ServicePortView, entry: str, key: str, shape: AnyShape, backends: tuple[Backend, ...]
) -> list[Element]:
    """The dispatch element, and for a shared ``lb-N`` the entry's backends by index (an
    affinity chain names its endpoints itself)."""
    out = [Element(DISPATCH[entry], key, f"goto {shape.chain}")]
    if isinstance(shape, Shape):
        data = _backends_map(entry, view.port.protocol)
        out += [
            new_tuple(Element, (data, f"{key} . {i}", f"{_text(b.ip)} . {b.port}"))
            for i, b in enumerate(backends)
        ]
    return out


#: the maps' names looked up, not formatted, per entry (~12k at 10k Services)
_backends_map = functools.cache(backends_map)


def calc_service_parts(model: ProxyModel) -> tuple[frozenset[Element], frozenset[AnyShape]]:
    """The elements and shapes of the port views of ``model`` (one Service's, for the table;
    node-wide sets aside). A hairpin element is needed for a local backend (a Pod reaching
    itself through its ClusterIP is DNATed on its own node) and, under externalTrafficPolicy
    Local, for every backend: a Pod on another node reaching this node's NodePort or external
    address is short-circuited and may be sent back to itself, which only works masqueraded."""
    elements: list[Element] = []
    shapes: set[AnyShape] = set()
    for view in model.ports:
        port_elements, port_shapes = calc_port_parts(view, model)
        elements += port_elements
        shapes |= port_shapes
        elements += [
            Element("service-vips", _text(ip)) for ip in _family(view.service.vips, model)
        ]
        if view.service.source_ranges:
            elements += calc_firewall_elements(view, model)
        remote = view.is_short_circuit(True)
        elements += [
            new_tuple(Element, ("hairpin", f"{text} . {text}", None))
            for b in view.backends
            if (b.local or remote) and b.ip.version == model.family and (text := _text(b.ip))
        ]
    return frozenset(elements), frozenset(shapes)


def calc_firewall_sources(view: ServicePortView, model: ProxyModel) -> tuple[IPNetwork, ...]:
    """Who may reach the port's load balancer IPs (none: no limit): its
    loadBalancerSourceRanges of the family and, when one holds an address of this node, the
    load balancer IPs themselves (a node that holds the VIP reaches it with the VIP as its
    source; kube-proxy allows that too), collapsed: an interval set refuses overlaps."""
    ranges = [n for n in view.service.source_ranges if n.version == model.family]
    if not ranges:
        return ()
    if any(ip in n for n in ranges for ip in model.node.node_ips if ip.version == n.version):
        ranges += [
            ipaddress.ip_network(ip) for ip in _family(view.service.load_balancer_ips, model)
        ]
    return tuple(ipaddress.collapse_addresses(ranges))  # type: ignore[type-var]


def calc_firewall_elements(view: ServicePortView, model: ProxyModel) -> list[Element]:
    """A load balancer IP key limited by source ranges: in ``firewall-ips``, and one
    ``firewall-allow`` element per source range it takes."""
    sources = calc_firewall_sources(view, model)
    if not sources:
        return []
    out = []
    for ip in _family(view.service.load_balancer_ips, model):
        key = f"{_text(ip)} . {view.port.protocol} . {view.port.port}"
        out.append(Element("firewall-ips", key))
        out += [Element("firewall-allow", f"{key} . {net}") for net in sources]
    return out


def calc_node_elements(model: ProxyModel) -> frozenset[Element]:
    """The node-wide sets: cluster CIDRs, service CIDRs, NodePort addresses."""
    node = model.node
    out = {Element("cluster-cidrs", str(n)) for n in _family(node.cluster_cidrs, model)}
    out |= {Element("service-cidrs", str(n)) for n in _family(node.service_cidrs, model)}
    out |= {Element("nodeport-ips", _text(ip)) for ip in _family(node.node_ips, model)}
    return frozenset(out)


def calc_elements(model: ProxyModel) -> frozenset[Element]:
    """All elements of a model: its Services' and the node-wide sets."""
    return calc_service_parts(model)[0] | calc_node_elements(model)


def render_elements(family: int, verb: str, elements: Iterable[Element]) -> str:
    """One ``add|delete element`` command per named set or map, elements sorted by key (in C:
    a full render sorts ~70k of them)."""
    by_name: dict[str, list[Element]] = {}
    for el in elements:
        by_name.setdefault(el.name, []).append(el)
    t = f"{FAMILY[family]} {TABLE}"
    return "".join(
        f"{verb} element {t} {name} {{ {_render_sorted(by_name[name])} }}\n"
        for name in sorted(by_name)
    )


def calc_element_batch(
    family: int, deletes: Iterable[Element], adds: Iterable[Element]
) -> ElementBatch | None:
    """The deletes, then the adds, as one element batch (what ``render_elements`` writes for
    them, in the same order); None when one of them is in a set kernel/nftelem.py does not
    write (an interval set)."""
    types, changes = calc_element_types(family), []
    for verb, elements in (("delete", deletes), ("add", adds)):
        by_name: dict[str, list[tuple[str, str | None]]] = {}
        for el in elements:
            by_name.setdefault(el.name, []).append((el.key, el.value))
        if any(name not in types for name in by_name):
            return None
        changes += [
            ElementChange(verb, name, types[name], tuple(by_name[name]))
            for name in sorted(by_name)
        ]
    return ElementBatch(FAMILY[family], TABLE, tuple(changes))


def _render_sorted(elements: list[Element]) -> str:
    elements.sort(key=_KEY)
    return ", ".join([k if v is None else f"{k} : {v}" for _, k, v in elements])


_KEY = operator.itemgetter(1)


@dataclass(frozen=True)
class FullRender:
    """Start or resync as pycnid runs it: three transactions, each atomic, each leaving a
    table that answers as either the old or the new state of every Service, but for the
    interval sets: a Service whose ``loadBalancerSourceRanges`` changed since the last
    commit has its new ranges one step (milliseconds) before its other elements.

    - ``declarations``: the skeleton, every shape, the interval sets (nft splits and merges
      their ranges) flushed and refilled. It adds what the new elements name and changes no
      other data: static chains are rewritten the same, a shape chain's name is its content.
    - ``elements``: every other data set and map flushed and refilled, one netlink batch
      (kernel/nftelem.py): libnftables took ~1.1 s to parse the ~85k elements of 10,000
      Services as text, the batch ~0.15 s to encode and ~0.15 s for the kernel.
    - ``deletes``: the shape chains nothing names any more (and an earlier layout's
      per-endpoint ``clients-`` sets).

    A plan given a way to start a transaction (``sync.calc_full_plan``'s ``early``) sends the
    skeleton and the affinity chains (``early``: ~95% of the declarations' parse at 10k
    Services, 5,500 rules) before it plans the other Services (``ServiceTable.send_early``),
    and ``declarations`` is then the rest: adding chains changes no data either, so that is a
    fourth step of the same kind.

    The ``clients`` set is added, never flushed: a resync keeps clients' affinity. The batch
    is made on first use from ``parts`` (the node's elements and each Service's): pycnid's
    ``run_plan`` asks for it while nft applies the declarations, so its ~85k elements are
    gathered on the second core's time, not before the declarations start."""

    declarations: str
    deletes: str
    family: int
    parts: tuple[Iterable[Element], ...]
    early: str = ""  # the skeleton and the shapes already sent (none: all in declarations)

    @functools.cached_property
    def elements(self) -> ElementBatch:
        """Every plain data set and map flushed, then filled (each element once)."""
        types = calc_element_types(self.family)
        plain: dict[str, list[tuple[str, str | None]]] = {
            n: [] for n in (*DATA_SETS, *DATA_MAPS) if n in types
        }
        for name, key, value in set().union(*self.parts):  # unpacked: ~85k at 10k Services
            bucket = plain.get(name)
            if bucket is not None:
                bucket.append((key, value))
        flushes = [ElementChange("flush", n, types[n], ()) for n in plain]
        adds = [ElementChange("add", n, types[n], tuple(plain[n])) for n in plain if plain[n]]
        return ElementBatch(FAMILY[self.family], TABLE, (*flushes, *adds))

    def render(self) -> str:
        """The steps as one nft script, the same table once applied."""
        return self.early + self.declarations + render_script(self.elements) + self.deletes


def calc_early_declarations(family: int, node: NodeView | None, shapes: Iterable[AnyShape]) -> str:
    """What a full render may send before the rest of its plan: the skeleton and ``shapes``
    (the affinity chains: they name only the skeleton's sets)."""
    return render_skeleton(family, node) + "".join(
        render_shape(family, s) for s in sorted(shapes, key=repr)
    )


def calc_full_render(
    family: int,
    shapes: Iterable[AnyShape],
    parts: tuple[Iterable[Element], ...],
    node: NodeView | None,
    deletes: str,
    early: tuple[str, frozenset[AnyShape]] | None = None,
) -> FullRender:
    """``parts``: the node's elements and each Service's (an element may be in several);
    ``early``: the script already sent (``calc_early_declarations``) and its shapes, which
    ``declarations`` leaves out with the skeleton."""
    t = f"{FAMILY[family]} {TABLE}"
    types = calc_element_types(family)  # the batch's; the others (interval sets) are nft's
    sent, declared = early if early is not None else ("", frozenset())
    declarations = (
        ("" if early is not None else render_skeleton(family, node))
        + "".join(render_shape(family, s) for s in sorted(shapes, key=repr) if s not in declared)
        + "".join(f"flush set {t} {n}\n" for n in DATA_SETS if n not in types)
        + render_elements(
            family, "add", dict.fromkeys(e for p in parts for e in p if e.name not in types)
        )
    )
    return FullRender(declarations, deletes, family, parts, sent)
