"""Fixtures of the generated-input tests: one node namespace with its own pycnid per module
(a daemon per case would cost more than the cases), a pod for it, and the anchor attachment."""

from __future__ import annotations

import os
import tempfile

import pytest

from .node import FuzzNode, start_fuzz_node, stop_fuzz_node

IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def fz(cni_bin) -> FuzzNode:
    if not IS_ROOT:
        pytest.skip("needs root for network namespaces")
    node = start_fuzz_node(cni_bin)
    try:
        node.add_anchor()
        yield node
    finally:
        stop_fuzz_node(node)


@pytest.fixture(scope="module")
def odd_files():
    """Paths that are not network namespaces: a FIFO, a regular file, a directory."""
    with tempfile.TemporaryDirectory(prefix="pycni-fuzz-") as tmp:
        fifo = os.path.join(tmp, "fifo")
        os.mkfifo(fifo)
        regular = os.path.join(tmp, "file")
        with open(regular, "w") as fh:
            fh.write("not a netns\n")
        yield {"fifo": fifo, "file": regular, "dir": tmp, "missing": os.path.join(tmp, "nope")}
