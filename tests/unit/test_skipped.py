"""common/skipped.Skipped under generated histories: each failure streak of a key is logged
once, the gauge always equals the keys that fail now, a snapshot forgets the keys it lacks."""

from __future__ import annotations

import logging

from hypothesis import given
from hypothesis import strategies as st

from common.metrics import Registry
from common.skipped import METRIC, Skipped

KEYS = st.sampled_from(["/a/1", "/a/2", "/b/1"])
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("note"), KEYS),
        st.tuples(st.just("clear"), KEYS),
        st.tuples(st.just("snapshot"), st.sets(KEYS)),
    ),
    max_size=30,
)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@given(steps=STEPS)
def test_each_failure_streak_is_logged_once_and_the_gauge_counts_what_fails_now(steps):
    log = logging.getLogger("test.skipped")
    lines = Lines()
    log.addHandler(lines)
    log.propagate = False
    registry = Registry()
    skipped = Skipped("proxy", log)
    skipped.attach(registry)
    failing: set[str] = set()
    logged = 0
    try:
        for op, arg in steps:
            if op == "note":
                logged += arg not in failing
                failing.add(arg)
                skipped.note(arg, "not JSON")
            elif op == "clear":
                failing.discard(arg)
                skipped.clear(arg)
            else:
                failing = {k for k in failing if not k.startswith("/a/") or k in arg}
                skipped.keep_only("/a/", set(arg))
            assert set(skipped.keys) == failing and len(skipped) == len(failing)
            assert f'{METRIC}{{consumer="proxy"}} {len(failing)}' in registry.render()
        assert len(lines.lines) == logged
        assert all(line.startswith("proxy: ignoring /") for line in lines.lines)
    finally:
        log.removeHandler(lines)
