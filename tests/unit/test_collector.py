"""The collector's pause (common/collector.py): restores what it found, whatever happens."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from common.collector import paused_gc


@pytest.fixture(autouse=True)
def collector_as_it_was() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    (gc.enable if enabled else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_a_pause_disables_then_restores_what_it_found_even_on_an_error(enabled: bool) -> None:
    (gc.enable if enabled else gc.disable)()
    with pytest.raises(RuntimeError), paused_gc():
        assert not gc.isenabled()
        raise RuntimeError("the work failed")
    assert gc.isenabled() is enabled


def test_pauses_overlapping_as_on_two_threads_end_with_the_collector_enabled() -> None:
    gc.enable()
    first, second = paused_gc(), paused_gc()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first pause ends while the second still runs
    assert gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()
