"""``freeze_heap`` (after each whole render of the proxy and of NetworkPolicy): what is alive
leaves the collector's generations, and what became cyclic garbage while frozen is collected by
the next whole render.
Run in a child interpreter: freezing the test process would hide its own garbage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import gc, json, weakref
from common.collector import freeze_heap

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a

kept = cycle()
freeze_heap()
frozen = gc.get_freeze_count()
gone = cycle()
probe = weakref.ref(gone)
gc.freeze()  # the cycle is alive now and frozen with the rest, as a pass's objects are
del gone
gc.collect()
alive_while_frozen = probe() is not None
freeze_heap()  # the next full render
print(json.dumps({
    "frozen": frozen,
    "alive_while_frozen": alive_while_frozen,
    "collected_after": probe() is None,
    "kept_alive": kept.other.other is kept,
}))
"""


def test_a_frozen_heap_is_collected_by_the_next_full_render():
    out = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout)
    assert got["frozen"] > 1000  # the interpreter's and pycni's objects, out of the generations
    assert got["alive_while_frozen"] and got["collected_after"] and got["kept_alive"]
