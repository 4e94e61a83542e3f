"""Fixtures of the namespace tests that more than one module uses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.netns import Netns
from tests.netns.drill_node import Drill, drill_node


@pytest.fixture
def drill(node: Netns, tmp_path, cni_path: str) -> Iterator[Drill]:
    """A fault-drill node (tests/netns/drill_node.py) in ``node``."""
    with drill_node(node, str(tmp_path), cni_path) as made:
        yield made
