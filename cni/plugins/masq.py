"""Applying pycni-bridge's masquerade elements: one atomic nft transaction per change.

The kernel holds the truth. An in-memory index (tag -> elements), read from the kernel on
first use, lets DEL remove an attachment's elements without listing the table; when a
transaction fails because the kernel differs from the index (someone removed the table, an
element is already gone), the index is re-read and the change retried once. CHECK and GC always
read the kernel. All of it runs in the node netns (``Nft`` refuses anything else).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable

from cni.net.nft import Nft, NftError, table_exists
from .masq_rules import (FAMILY, TABLE, Element, elements_for, parse_elements, render_add,
                         render_delete, render_table)

log = logging.getLogger("pycnid.bridge.masq")


class Masquerader:
    def __init__(self, nft: Nft) -> None:
        self.nft = nft
        self._lock = threading.Lock()
        self._index: dict[str, set[Element]] | None = None
        self._table_ready = False

    def add(self, tag: str, pairs: Iterable[tuple[Any, Any]]) -> None:
        """Masquerade traffic of these (address, subnet) pairs leaving their subnet."""
        wanted = elements_for(tag, pairs)
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
        stale_tags = {t for t, elems in index.items() if t == tag or keys & elems}
        stale = [e for t in stale_tags for e in index[t]]
        script = ("" if self._table_ready else render_table()) + render_delete(stale) + render_add(wanted)
        self.nft.run(script)
        self._table_ready = True
        for t in stale_tags:
            index.pop(t, None)
        index[tag] = set(wanted)

    def _apply_remove(self, tag: str) -> None:
        index = self._loaded()
        elems = index.get(tag)
        if elems:
            self.nft.run(render_delete(elems))
        index.pop(tag, None)

    def _read_kernel(self) -> dict[str, set[Element]]:
        if not table_exists(self.nft, FAMILY, TABLE):
            return {}
        index: dict[str, set[Element]] = {}
        for elem in parse_elements(self.nft.list_json(f"list table {FAMILY} {TABLE}")):
            if elem.tag:
                index.setdefault(elem.tag, set()).add(elem)
        return index
