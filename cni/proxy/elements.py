"""A model's map and set elements, and the one transaction that turns committed M0 into M1.

knftables style: the in-memory copy of what was committed (the previous model) is the only
state; a sync renders element deletes and adds against it, never a listing of the table. A
full render (M0 None, at start or after a failed transaction) rewrites the static chains and
flushes every data map, but not the ``sticky-i`` sets: a resync keeps clients' affinity.
"""
from __future__ import annotations

from typing import Iterable

from .model import Backend, ProxyModel, ServicePortView
from .render import (DATA_MAPS, DATA_SETS, FAMILY, PREFIX, TABLE, Element, Shape,
                     backends_map, render_shape, render_skeleton)

REJECT, DROP = "goto reject-chain", "drop"


def calc_entries(view: ServicePortView, model: ProxyModel) -> list[tuple[str, str, bool]]:
    """(entry kind, nft key, external?) of every way a packet reaches this service port."""
    proto, port, svc = view.port.protocol, view.port.port, view.service
    entries = [("vip", f"{ip} . {proto} . {port}", False) for ip in _family(svc.vips, model)]
    entries += [("vip", f"{ip} . {proto} . {port}", True) for ip in _family(svc.external_ips, model)]
    if view.port.node_port is not None and model.node.node_ips:
        entries.append(("np", f"{proto} . {view.port.node_port}", True))
    return entries


def _family(ips: Iterable, model: ProxyModel) -> list:
    return [ip for ip in ips if ip.version == model.family]


def calc_shape(view: ServicePortView, entry: str, count: int) -> Shape:
    timeout = view.service.affinity_timeout
    return Shape(entry, "aff" if timeout else "lb", count, timeout or 0)


def calc_port_elements(view: ServicePortView, model: ProxyModel) -> set[Element]:
    """Every element one service port contributes (dispatch, backends, masquerade, checks)."""
    out: set[Element] = set()
    for entry, key, external in calc_entries(view, model):
        backends = view.calc_backends(external)
        out |= _masq_elements(view, entry, key, external)
        if not backends:
            verdict = DROP if view.backends and view.is_local_policy(external) else REJECT
            name = "no-endpoints" if entry == "vip" else "no-endpoint-nodeports"
            out.add(Element(name, key, verdict))
            continue
        out |= _dispatch_elements(view, entry, key, backends)
    return out


def _masq_elements(view: ServicePortView, entry: str, key: str, external: bool) -> set[Element]:
    if not external:
        return {Element("internal-ports", key)}
    if view.service.external_local:
        return set()
    return {Element("external-masq" if entry == "vip" else "nodeport-masq", key)}


def _dispatch_elements(view: ServicePortView, entry: str, key: str,
                       backends: tuple[Backend, ...]) -> set[Element]:
    shape = calc_shape(view, entry, len(backends))
    dispatch = "service-ips" if entry == "vip" else "service-nodeports"
    out = {Element(dispatch, key, f"goto {shape.chain}")}
    for i, b in enumerate(backends):
        out.add(Element(backends_map(entry, view.port.protocol), f"{key} . {i}", _dest(b)))
        if shape.kind == "aff":
            out.add(Element(f"{PREFIX[entry]}slot-{i}", key, _dest(b)))
    return out


def _dest(b: Backend) -> str:
    return f"{b.ip} . {b.port}"


def calc_elements(model: ProxyModel) -> frozenset[Element]:
    """All elements of a model: per port, plus node-wide sets (CIDRs, node IPs, VIPs, hairpin)."""
    out: set[Element] = set()
    for view in model.ports:
        out |= calc_port_elements(view, model)
        out |= {Element("service-vips", str(ip)) for ip in _family(view.service.vips, model)}
        out |= {Element("hairpin", f"{b.ip} . {b.ip}") for b in view.backends
                if b.ip.version == model.family}
    node = model.node
    out |= {Element("cluster-cidrs", str(n)) for n in _family(node.cluster_cidrs, model)}
    out |= {Element("service-cidrs", str(n)) for n in _family(node.service_cidrs, model)}
    out |= {Element("nodeport-ips", str(ip)) for ip in _family(node.node_ips, model)}
    return frozenset(out)


def calc_shapes(model: ProxyModel) -> frozenset[Shape]:
    """The shared chains the model's dispatch elements point at."""
    shapes = set()
    for view in model.ports:
        for entry, _key, external in calc_entries(view, model):
            count = len(view.calc_backends(external))
            if count:
                shapes.add(calc_shape(view, entry, count))
    return frozenset(shapes)


def calc_diff(e0: frozenset[Element], e1: frozenset[Element]) -> tuple[list[Element], list[Element]]:
    """(deletes, adds): a changed map value is a delete of the old element and an add."""
    return sorted(e0 - e1), sorted(e1 - e0)


def apply_diff(e0: frozenset[Element], deletes: list[Element], adds: list[Element]) -> frozenset[Element]:
    return (e0 - set(deletes)) | set(adds)


def render_elements(family: int, verb: str, elements: Iterable[Element]) -> str:
    """One ``add|delete element`` command per named set or map, elements sorted."""
    by_name: dict[str, list[Element]] = {}
    for el in sorted(elements):
        by_name.setdefault(el.name, []).append(el)
    t = f"{FAMILY[family]} {TABLE}"
    return "".join(f"{verb} element {t} {name} {{ {', '.join(e.render() for e in els)} }}\n"
                   for name, els in by_name.items())


def render_full(m1: ProxyModel) -> str:
    """Start or resync: skeleton, every shape, data maps flushed and refilled."""
    t = f"{FAMILY[m1.family]} {TABLE}"
    shapes = "".join(render_shape(m1.family, s) for s in sorted(calc_shapes(m1)))
    slots = sorted({e.name for e in calc_elements(m1) if "slot-" in e.name})
    flushes = [f"flush set {t} {n}\n" for n in DATA_SETS]
    flushes += [f"flush map {t} {n}\n" for n in (*DATA_MAPS, *slots)]
    return (render_skeleton(m1.family) + shapes + "".join(flushes)
            + render_elements(m1.family, "add", calc_elements(m1)))


def render_transaction(m0: ProxyModel | None, m1: ProxyModel) -> str:
    """The one atomic script from committed M0 to M1: new shapes, element deletes, adds."""
    if m0 is None:
        return render_full(m1)
    new_shapes = sorted(calc_shapes(m1) - calc_shapes(m0))
    deletes, adds = calc_diff(calc_elements(m0), calc_elements(m1))
    return ("".join(render_shape(m1.family, s) for s in new_shapes)
            + render_elements(m1.family, "delete", deletes)
            + render_elements(m1.family, "add", adds))


# --- per Service (cni/proxy/table.py keeps these per Service and diffs only what changed) ---

def calc_service_elements(model: ProxyModel) -> frozenset[Element]:
    """The elements the port views of ``model`` (one Service's) contribute, node-wide sets
    aside. A hairpin element is only needed for a local backend: a Pod reaching itself
    through its Service is DNATed on its own node."""
    out: set[Element] = set()
    for view in model.ports:
        out |= calc_port_elements(view, model)
        out |= {Element("service-vips", str(ip)) for ip in _family(view.service.vips, model)}
        out |= {Element("hairpin", f"{b.ip} . {b.ip}") for b in view.backends
                if b.local and b.ip.version == model.family}
    return frozenset(out)


def calc_service_shapes(model: ProxyModel) -> frozenset[Shape]:
    return calc_shapes(model)


def calc_node_elements(model: ProxyModel) -> frozenset[Element]:
    """The node-wide sets: cluster CIDRs, service CIDRs, NodePort addresses."""
    node = model.node
    out = {Element("cluster-cidrs", str(n)) for n in _family(node.cluster_cidrs, model)}
    out |= {Element("service-cidrs", str(n)) for n in _family(node.service_cidrs, model)}
    out |= {Element("nodeport-ips", str(ip)) for ip in _family(node.node_ips, model)}
    return frozenset(out)


def render_full_script(family: int, shapes: Iterable[Shape], elements: Iterable[Element]) -> str:
    """Start or resync: skeleton, every shape, data maps flushed and refilled."""
    t, elements = f"{FAMILY[family]} {TABLE}", list(elements)
    slots = sorted({e.name for e in elements if "slot-" in e.name})
    flushes = [f"flush set {t} {n}\n" for n in DATA_SETS]
    flushes += [f"flush map {t} {n}\n" for n in (*DATA_MAPS, *slots)]
    return (render_skeleton(family) + "".join(render_shape(family, s) for s in sorted(shapes))
            + "".join(flushes) + render_elements(family, "add", elements))
