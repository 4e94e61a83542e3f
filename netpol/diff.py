"""The transaction that turns the table holding one layout into the next (pure).

``render_diff(old, new)`` is one nft script, sent instead of ``render.render_full`` while the
kernel is known to hold ``old``: nothing is flushed but what changed, so a Pod's relabel costs
the elements and chains it touches, not the table (1,000 policies × 10k Pods: ~100k
elements). Its order keeps every reference valid at each command (the kernel checks them as
the transaction is built) and never opens a window (one transaction: a packet meets ``old``
or ``new``):

1. new sets and maps, counters, chains (empty: a vmap element or a rule may name them);
2. the elements gone from a set present in both, then the new ones (a map's changed value is a
   delete and an add of its key). Deletes come first: an interval set refuses an interval
   that overlaps one still there, even one this transaction deletes later ({10.0.0.1,
   10.0.0.3} → {10.0.0.1-10.0.0.3} is refused the other way round);
3. the rules of new chains, and of chains present in both whose rules differ (flushed and
   refilled: a rule whose set would be empty is left out, so one chain name may hold
   different rules over time);
4. what only ``old`` had, once nothing refers to it: chains (flushed, then deleted: no vmap
   element jumps to them after 2), then sets and maps (no rule names them after 3 and 4's
   chains), then counters (no counter map element names them after 2).

The base chain ``forward`` and its rules never change (``render.render_base_rules``). A set
keeps its declaration for its name (the names say their content, and the fixed ones their
type); one that changed is ``NotDiffable``: the caller renders the table whole.

``calc_element_batch`` gives the same transaction as one netlink batch when it is 2 and 4
alone, on plain sets and maps (kernel/nftelem.py encodes no intervals, and no rules), with
1's counters: a Pod's relabel, mostly, since a rule's Pods are a plain set
(``render.calc_peer_sets``), a local Pod that becomes isolated or not in a shape chain the
kernel holds (its map entries and its drop counter), and one that leaves a chain it was
alone in (the chain and the sets only it named go too). ``calc_first_render`` is the table
whole into a kernel that holds none of it, its plain elements as a batch after the script.
"""

from __future__ import annotations

from kernel.nftelem import (
    COUNTER,
    DATATYPES,
    VERDICT,
    CounterChange,
    ElementBatch,
    ElementChange,
    NewChain,
    Removal,
    SetType,
)
from kernel.nftrule import encode_rule
from netpol.render import TABLE, Layout, NamedSet, T, render_full


class NotDiffable(ValueError):
    """A set present in both layouts with another declaration: only a full render helps."""


def render_diff(old: Layout, new: Layout) -> str:
    """One transaction from ``old`` to ``new``; '' when they hold the same."""
    check_declarations(old, new)
    out = render_declarations(old, new)
    out += [line for s in old.sets.values() for line in render_element_deletes(s, new)]
    out += [line for s in new.sets.values() for line in render_element_adds(old, s)]
    out += render_rules(old, new)
    out += render_removals(old, new)
    return "".join(out)


def check_declarations(old: Layout, new: Layout) -> None:
    """NotDiffable when a set of both layouts changed its declaration."""
    for name, s in new.sets.items():
        if name in old.sets and _declaration(old.sets[name]) != _declaration(s):
            raise NotDiffable(f"set {name} changed its declaration")


def render_declarations(old: Layout, new: Layout) -> list[str]:
    out = [s.declare() for n, s in new.sets.items() if n not in old.sets]
    out += [f"add counter {T} {c}\n" for c in sorted(new.counters - old.counters)]
    return out + [f"add chain {T} {c}\n" for c in new.chains if c not in old.chains]


def render_rules(old: Layout, new: Layout) -> list[str]:
    """The rules of the new chains, and of the chains whose rules changed (flushed first)."""
    changed = [c for c, rules in new.chains.items() if old.chains.get(c, rules) != rules]
    out = [f"flush chain {T} {c}\n" for c in changed]
    return out + [
        f"add rule {T} {c} {r}\n"
        for c, rules in new.chains.items()
        if c not in old.chains or c in changed
        for r in rules
    ]


def render_element_deletes(old: NamedSet, new: Layout) -> list[str]:
    gone = calc_gone(old, new)
    return [_element_command("delete", old.name, gone)] if gone else []


def render_element_adds(old: Layout, new: NamedSet) -> list[str]:
    added = calc_added(old, new)
    return [_element_command("add", new.name, added)] if added else []


def calc_gone(old: NamedSet, new: Layout) -> list[str]:
    """What ``old`` held and the same set in ``new`` does not (a set gone from ``new`` is
    deleted whole); a map's by key: its value may have changed."""
    kept = new.sets.get(old.name)
    if kept is old or kept is None or kept.elements == old.elements:  # most: unchanged
        return []
    held = set(kept.elements)
    gone = [e for e in old.elements if e not in held]
    if old.kind == "map":  # an entry whose key is gone or whose value changed: its key
        # (compared whole, only the entries that differ are split: a relabel rebuilds the
        # local Pods' maps, ~100 entries each, to change one)
        return list(dict.fromkeys(e.partition(" : ")[0] for e in gone))
    return gone


def calc_added(old: Layout, new: NamedSet) -> list[str]:
    """What ``new`` holds and the same set in ``old`` did not (all of a new set's)."""
    before = old.sets.get(new.name)
    if before is new or before is not None and before.elements == new.elements:
        return []
    held = set(before.elements) if before is not None else set()
    return [e for e in new.elements if e not in held]


def calc_element_batch(old: Layout, new: Layout) -> ElementBatch | None:
    """The diff as one netlink batch (``Nft.run_elements``) when it is elements of plain
    sets and maps whose datatypes kernel/nftelem.py encodes, counters, new chains whose rules
    kernel/nftrule.py encodes (a local Pod isolated under a list of policies no chain had),
    and removals (chains, sets and maps only ``old`` had: a local Pod no longer isolated in a
    chain it was alone in); else None (nft's script: a new set, changed rules, intervals).
    NotDiffable, as ``render_diff``, when a set changed its declaration. libnftables first
    re-reads the table's declarations and its interval sets' elements (a script of a few
    elements: ~5-20 ms at 1,000 policies x 10k Pods); the batch is the changed elements alone
    (6 of them: ~0.5 ms)."""
    if any(c in old.chains and old.chains[c] != rules for c, rules in new.chains.items()):
        return None  # a chain's rules changed
    if not new.sets.keys() <= old.sets.keys():
        return None  # a new set: declared by nft's script
    chains = calc_new_chains(old, new)
    if chains is None:
        return None  # a rule the encoder does not take
    check_declarations(old, new)
    changes = []
    for s in new.sets.values():
        if old.sets[s.name] is s:  # kept from the last pass's render (most sets): unchanged
            continue
        gone, added = calc_gone(old.sets[s.name], new), calc_added(old, s)
        if not gone and not added:
            continue
        set_type = calc_set_type(s)
        if set_type is None:
            return None
        if gone:
            changes.append(
                ElementChange("delete", s.name, set_type, tuple((e, None) for e in gone))
            )
        if added:
            changes.append(ElementChange("add", s.name, set_type, tuple(map(_key_data, added))))
    counters = [CounterChange("add", c) for c in sorted(new.counters - old.counters)]
    counters += [CounterChange("delete", c) for c in sorted(old.counters - new.counters)]
    removals = [Removal("chain", c) for c in old.chains if c not in new.chains]
    removals += [Removal(s.kind, n) for n, s in old.sets.items() if n not in new.sets]
    if not changes and not counters and not removals and not chains:
        return None
    deletes = [c for c in changes if c.verb == "delete"]
    adds = [c for c in changes if c.verb == "add"]
    return ElementBatch("inet", TABLE, (*deletes, *adds), tuple(counters), tuple(removals), chains)


def calc_new_chains(old: Layout, new: Layout) -> tuple[NewChain, ...] | None:
    """The chains only ``new`` has, each with its rules' expressions; None when a rule is
    not one kernel/nftrule.py encodes."""
    out = []
    for name, rules in new.chains.items():
        if name in old.chains:
            continue
        expressions = tuple(encode_rule(rule) for rule in rules)
        if any(e is None for e in expressions):
            return None
        out.append(NewChain(name, tuple(rules), tuple(e for e in expressions if e is not None)))
    return tuple(out)


def calc_first_render(layout: Layout) -> tuple[str, ElementBatch | None]:
    """The whole table into a kernel whose table holds nothing (none yet, or one without
    objects: nothing is isolated): ``render_full`` without the plain sets' and maps'
    elements, then those as one netlink batch (libnftables parses ~100k elements as text at
    1,000 policies x 10k Pods). No window opens: until the batch, the vmaps are empty, no
    packet reaches a policy's chain and every Pod is as unisolated as before; the batch
    fills every set and map at once."""
    changes = []
    for s in layout.sets.values():
        set_type = calc_set_type(s)
        if s.elements and set_type is not None:
            elements = tuple(map(_key_data, s.elements))
            changes.append(ElementChange("add", s.name, set_type, elements))
    script = render_full(layout, batched=[c.set for c in changes])
    return script, ElementBatch("inet", TABLE, tuple(changes)) if changes else None


def calc_set_type(s: NamedSet) -> SetType | None:
    """``ipv4_addr . inet_proto . inet_service``, ``ipv4_addr : verdict`` … as the encoder's
    datatypes; None for an interval set or a datatype it does not know."""
    key, _, data = s.type.partition(" : ")
    fields = tuple(key.split(" . "))
    if s.interval or not set(fields) <= DATATYPES:
        return None
    if s.kind == "set":
        return SetType(fields)
    types = {"verdict": VERDICT, "counter": COUNTER}.get(data)
    return SetType(fields, types) if types is not None else None


def _key_data(element: str) -> tuple[str, str | None]:
    key, _, data = element.partition(" : ")
    return key, data or None


def render_removals(old: Layout, new: Layout) -> list[str]:
    chains = [c for c in old.chains if c not in new.chains]
    out = [f"flush chain {T} {c}\n" for c in chains]
    out += [f"delete chain {T} {c}\n" for c in chains]
    out += [f"delete {s.kind} {T} {n}\n" for n, s in old.sets.items() if n not in new.sets]
    out += [f"delete counter {T} {c}\n" for c in sorted(old.counters - new.counters)]
    return out


def _declaration(s: NamedSet) -> tuple[str, str, bool]:
    return s.kind, s.type, s.interval


def _element_command(verb: str, name: str, elements: list[str]) -> str:
    return f"{verb} element {T} {name} {{ {', '.join(elements)} }}\n"
