"""The cyclic garbage collector paused over CPU-bound work that makes many objects and no
cyclic garbage: decoding a list page, converting it, indexing what it gave.

At 10k Services x 5 endpoints the collector's passes over the new objects (promoted, then
walked again by every full collection, with the whole heap) were half of a relist's CPU time
(bench/svc_api_split.py). Reference counting still frees everything freed meanwhile; what a
pause defers is only the collector's own pass, due at the next allocation after it.

The collector is process-wide: a pause restores only what it found, so pauses that overlap
on two threads end with the collector enabled again (by the first pause's end). Pause only
work that waits on no network and no timer (a lock held by other such work at most): it
must stay short.

After a whole render (the proxy's, NetworkPolicy's) what is alive is frozen (``freeze_heap``):
the records and tables, ~10^6 objects at 10k Services, then leave the collector's
generations, so the collections a pause defers, and every later full one, do not walk them.
After any other NetworkPolicy pass, what it made and kept is frozen the same way but without
a collection (``freeze_young``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def freeze_heap() -> None:
    """After a whole render: one collection, then every object alive (the records and the
    tables, ~10^6 at 10k Services) leaves the collector's generations (``gc.freeze``), so a
    later full collection, due on whichever thread allocates, no longer walks them: one took
    0.15-0.44 s at 10k Services, stalling the watch and the next pass. The next whole render
    unfreezes first, so what became cyclic garbage meanwhile is collected then."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def freeze_young() -> None:
    """After a pass that paused the collector: every object alive, the pass's new layout and
    sets with it, leaves the collector's generations (``gc.freeze``: no walk, no collection).
    Otherwise the young collection the pause deferred walks them at the next allocation, on
    whichever thread allocates next: in pycnid enforcing 1,000 policies over 10k Pods, the
    request handlers' (gen0 collections of 1-2 ms in ADD and DEL handlers, ~1 ms an ADD on
    average; bench/netpol_node.py's figure (d)). What of it becomes garbage is still freed by
    reference counting; only cyclic garbage waits for the next ``freeze_heap`` (the next whole
    render, within the resync interval)."""
    gc.freeze()
