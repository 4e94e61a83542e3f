"""`pycni node`'s heartbeat parser and health column (nodes.ops), over generated input:
any stored heartbeat bytes give a health, never an exception."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from nodes.ops import Beat, calc_health, parse_heartbeat
from nodes.record import heartbeat_key
from store.base import KV
from store.codec import encode

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
heartbeats = st.binary(max_size=64) | st.dictionaries(
    st.sampled_from(["node", "lease", "grantedAt", "pid"]), json_values
).map(lambda d: json.dumps(d, allow_nan=True).encode())


@given(heartbeats)
def test_any_heartbeat_value_parses_to_a_sane_beat(value):
    beat = parse_heartbeat(KV(heartbeat_key("n"), value, 1))
    assert beat.lease is None or beat.lease > 0
    assert beat.granted_at is None or math.isfinite(beat.granted_at)


@given(st.integers(1, 2**63 - 1), st.floats(0, 2e9))
def test_a_heartbeat_as_pycnid_writes_it_reads_back(lease, granted):
    value = encode({"node": "n", "lease": f"{lease:x}", "grantedAt": granted, "pid": 1})
    assert parse_heartbeat(KV(heartbeat_key("n"), value, 1)) == Beat(lease, granted)


@given(
    st.none() | st.builds(Beat, st.none() | st.integers(1, 2**63), st.none() | st.floats(0, 2e9)),
    st.booleans(),
    st.floats(0, 2e9),
    st.none() | st.integers(-1, 10**6),
    st.none() | st.floats(0, 2e9),
)
def test_health_is_alive_exactly_while_the_heartbeat_exists(beat, leases, now, ttl, since):
    health = calc_health(beat, leases, now, ttl, since)
    assert health["state"] == ("unknown" if not leases else "alive" if beat else "dead")
    assert health["heartbeat"] == (beat is not None) and health["text"]
    if health["state"] == "alive" and ttl is not None and ttl >= 0:
        assert f"lease {ttl} s left" in health["text"]
