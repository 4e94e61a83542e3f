"""``kernel.nft._beside``: the foreground's result once the background (nft's parse, the
kernel's commit of an element batch) is done, and the transaction's failure before the
foreground's. Generated: any pair of outcomes, and a background slower than the foreground."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.nft import NftError, _beside


class Refused(Exception):
    pass


@given(
    background_fails=st.booleans(),
    foreground_fails=st.booleans(),
    background_delay=st.sampled_from([0.0, 0.002]),
)
def test_beside_waits_for_the_background_and_raises_its_failure_first(
    background_fails: bool, foreground_fails: bool, background_delay: float
) -> None:
    done: list[str] = []

    def background() -> None:
        time.sleep(background_delay)
        done.append(threading.current_thread().name)
        if background_fails:
            raise NftError("element batch refused")

    def foreground() -> int:
        if foreground_fails:
            raise Refused("counts")
        return 7

    if background_fails:
        with pytest.raises(NftError):
            _beside(background, foreground)
    elif foreground_fails:
        with pytest.raises(Refused):
            _beside(background, foreground)
    else:
        assert _beside(background, foreground) == 7
    # whatever was raised, the background ran to its end, on a thread of its own
    assert done == ["nft-beside"]
    assert not any(t.name == "nft-beside" for t in threading.enumerate())


def test_beside_runs_both_at_once() -> None:
    """The foreground does not wait for the background to start or end: each waits for
    the other once, which only two at once can do."""
    started, answered = threading.Event(), threading.Event()

    def background() -> None:
        started.set()
        assert answered.wait(5)

    def foreground() -> str:
        assert started.wait(5)
        answered.set()
        return "both"

    assert _beside(background, foreground) == "both"
