"""`make bench-netpol`'s ADD cost reads, beside the timed ADDs, pycnid's own time serving each
one from its log: the lines pycnid's dispatcher writes (rendered here by its own logger and
formatter), for generated requests. Per container id: the last served ADD of pycni-bridge and
of pycni-svc, their sum only when both were served; failed requests, other commands and other
plugins never count, nor do lines that are not pycnid's JSON."""

from __future__ import annotations

import io
import logging

from hypothesis import given
from hypothesis import strategies as st

from bench.netpol_node import calc_served
from pycnid.dispatch import Dispatcher, Reply
from pycnid.logs import JsonLines

requests = st.lists(
    st.tuples(
        st.sampled_from(["bridge", "svc", "ipam"]),
        st.sampled_from(["ADD", "DEL", "CHECK"]),
        st.sampled_from(["c1", "c2", "c3"]),
        st.floats(min_value=0.0, max_value=2.0, allow_nan=False),
        st.booleans(),  # failed
    ),
    max_size=12,
)
noise = st.lists(st.sampled_from(["", "not json", "[1, 2]", '{"msg": "request served"}']))


def render_log(served: list[tuple[str, str, str, float, bool]], extra: list[str]) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonLines())
    logger = logging.getLogger("pycnid.dispatch")
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    try:
        dispatcher = Dispatcher({})
        for plugin, command, cid, seconds, failed in served:
            env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": "eth0"}
            reply = Reply(1, '{"code": 11, "msg": "later"}') if failed else Reply(0, "{}")
            dispatcher._log(plugin, env, None, reply, seconds)
    finally:
        logger.removeHandler(handler)
        logger.level = level
    return out.getvalue() + "".join(f"{line}\n" for line in extra)


@given(served=requests, extra=noise)
def test_each_container_gets_its_last_served_adds(
    served: list[tuple[str, str, str, float, bool]], extra: list[str]
) -> None:
    expected: dict[str, dict[str, float]] = {}
    for plugin, command, cid, seconds, failed in served:
        if command == "ADD" and plugin in ("bridge", "svc") and not failed:
            expected.setdefault(cid, {})[plugin] = round(seconds * 1000, 2)
    for times in expected.values():
        if len(times) == 2:
            times["both"] = times["bridge"] + times["svc"]
    assert calc_served(render_log(served, extra)) == expected
