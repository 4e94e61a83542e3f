"""The one writer of the pycni-masq table: one atomic nft transaction per change.

pycnid makes one ``MasqTable`` (``pycnid/wiring.py``) and lends it to both of the table's
users: pycni-bridge's ipMasq adds and removes an attachment's elements (``add``, ``remove``,
``collect``), the overlay sets the cluster's pools it must leave alone (``ensure_cluster``).

An attachment's elements are added and removed as one netlink batch (``Nft.run_elements``:
no libnftables cache refill, several ms beside another table's thousands of sets); the
table itself, the first time, and the cluster's pools are nft scripts.

The kernel holds the truth. An in-memory index (tag -> elements), read from the kernel on
first use, lets DEL remove an attachment's elements without listing the table; when a
transaction fails because the kernel differs from the index (someone removed the table, an
element is already gone), the index is re-read and the change retried once. CHECK and GC always
read the kernel. All of it runs in the node netns (``Nft`` refuses anything else).

Elements belong to one attachment (their tag). An ADD whose (bridge, address) another tag
holds is refused when that attachment is live (its host veth is on the node): two pods with
one address on one bridge are an address conflict. The elements of a tag with no host veth
left are stale and taken over. A table in the legacy layout is rewritten on first read, its
live attachments' elements rekeyed by the bridge their host veth is a port of.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from cni.spec.errors import AddressConflict
from common.attachment import tag_of_alias
from kernel import link
from kernel.nft import Nft, NftError, table_exists
from kernel.session import node_session
from masq.rules import (
    FAMILY,
    TABLE,
    Element,
    calc_element_batch,
    describe_key,
    elements_for,
    is_legacy,
    migrate_elements,
    parse_elements,
    render_add,
    render_cluster,
    render_delete,
    render_migration,
)

log = logging.getLogger("pycnid.bridge.masq")


def live_attachments() -> dict[str, str]:
    """Tag -> bridge name of every labelled host veth that is a bridge port (node netns)."""
    with node_session() as ipr:
        links = link.list_links(ipr)
    names = {found.index: found.name for found in links}
    return {
        tag: names[found.master]
        for found in links
        if (tag := tag_of_alias(found.alias)) and found.master in names
    }


class MasqTable:
    """Owns the pycni-masq table: its static part, each attachment's elements (by tag) and
    the cluster's pools (``cluster``: read when this writer first makes the table; the overlay
    names its source with ``follow_cluster`` and pushes changes with ``ensure_cluster``)."""

    def __init__(
        self,
        nft: Nft,
        attachments: Callable[[], dict[str, str]] = live_attachments,
        cluster: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        self.nft = nft
        self.attachments = attachments
        self.cluster = cluster  # the cluster's pools, on an overlay node (never masqueraded)
        self._lock = threading.Lock()
        self._index: dict[str, set[Element]] | None = None
        self._table_ready = False
        self._cluster_set: list[str] | None = None  # what ensure_cluster last wrote

    def follow_cluster(self, cluster: Callable[[], Iterable[str]]) -> None:
        """Read the cluster's pools from ``cluster`` when this writer makes the table."""
        self.cluster = cluster

    def ensure_cluster(self, cidrs: list[str]) -> None:
        """The cluster's pools as the table's no-masquerade destinations, only where the
        table exists: a node whose networks do not masquerade gets no NAT table (and so no
        conntrack) from here; ``add`` fills the sets when it makes the table. Written again
        only when ``cidrs`` changed or the table was gone; NftError or ValueError (a bad
        CIDR) when refused."""
        with self._lock:
            if not table_exists(self.nft, FAMILY, TABLE):
                self._cluster_set = None
                return
            if cidrs == self._cluster_set:
                return
            self.nft.run(render_cluster(cidrs))
            self._cluster_set = cidrs

    def add(self, tag: str, bridge: str, pairs: Iterable[tuple[Any, Any]]) -> None:
        """Masquerade traffic of these (address, subnet) pairs from ``bridge`` leaving their
        subnet; AddressConflict when a live attachment holds one of them on that bridge."""
        wanted = elements_for(tag, bridge, pairs)
        if wanted:
            self._retrying(lambda: self._apply_add(tag, wanted))

    def remove(self, tag: str) -> None:
        """Remove every element of the attachment ``tag`` (none is fine)."""
        self._retrying(lambda: self._apply_remove(tag))

    def elements(self, tag: str) -> set[Element]:
        """The attachment's elements as the kernel has them now."""
        with self._lock:
            self._index = self._read_kernel()
            return set(self._index.get(tag, ()))

    def collect(self, keep: Callable[[str], bool]) -> list[str]:
        """GC: remove the elements of every tag ``keep`` rejects; returns the errors met."""
        errors = []
        with self._lock:
            self._index = self._read_kernel()
            for tag in sorted(t for t in self._index if not keep(t)):
                try:
                    self._apply_remove(tag)
                except NftError as exc:
                    errors.append(f"masquerade elements of {tag}: {exc}")
        return errors

    def _retrying(self, apply: Callable[[], None]) -> None:
        with self._lock:
            try:
                apply()
            except NftError as exc:
                log.info("nft transaction failed (%s); re-reading the table", exc)
                self._index, self._table_ready = None, False
                apply()

    def _loaded(self) -> dict[str, set[Element]]:
        if self._index is None:
            self._index = self._read_kernel()
        return self._index

    def _apply_add(self, tag: str, wanted: list[Element]) -> None:
        index = self._loaded()
        keys = set(wanted)
        others = {t for t, elems in index.items() if t != tag and keys & elems}
        if others:
            self._refuse_live(others, keys, index)
        stale_tags = others | ({tag} & index.keys())
        stale = [e for t in stale_tags for e in index[t]]
        if self._table_ready:
            self.nft.run_elements(calc_element_batch(stale, wanted))
        else:
            table = render_cluster(self.cluster())
            self.nft.run(table + render_delete(stale) + render_add(wanted))
            self._table_ready = True
        for t in stale_tags:
            index.pop(t, None)
        index[tag] = set(wanted)

    def _refuse_live(
        self, others: set[str], keys: set[Element], index: dict[str, set[Element]]
    ) -> None:
        """AddressConflict when a live attachment holds one of ``keys``; else they are stale."""
        live = self.attachments()
        held = sorted(t for t in others if t in live)
        if held:
            key = min(e.key for e in keys & index[held[0]])
            raise AddressConflict(
                f"address {describe_key(key)} is already used by attachment {held[0]}",
                "two attachments on one bridge cannot share an address: give "
                "their networks different ranges or different bridges",
            )
        log.info(
            "taking over the masquerade elements of stale attachment(s) %s",
            ", ".join(sorted(others)),
        )

    def _apply_remove(self, tag: str) -> None:
        index = self._loaded()
        elems = index.get(tag)
        if elems:
            self.nft.run_elements(calc_element_batch(elems, ()))
        index.pop(tag, None)

    def _read_kernel(self) -> dict[str, set[Element]]:
        if not table_exists(self.nft, FAMILY, TABLE):
            return {}
        doc = self.nft.list_json(f"list table {FAMILY} {TABLE}")
        elements = self._migrate(parse_elements(doc)) if is_legacy(doc) else parse_elements(doc)
        index: dict[str, set[Element]] = {}
        for elem in elements:
            if elem.tag:
                index.setdefault(elem.tag, set()).add(elem)
        return index

    def _migrate(self, legacy: list[Element]) -> list[Element]:
        """Rewrite a legacy table in this layout (one transaction), keeping live attachments."""
        kept = migrate_elements(legacy, self.attachments())
        self.nft.run(render_migration(kept))
        self._table_ready = True
        log.warning(
            "masquerade table %s %s rewritten in the bridge-keyed layout: %d of %d "
            "elements kept (the rest had no host veth on a bridge)",
            FAMILY,
            TABLE,
            len(kept),
            len(legacy),
        )
        return kept
