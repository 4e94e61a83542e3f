"""What `pycni net` reads from a plugin's stdout: whatever a plugin prints, a result or a
CNIError, never another exception (deep nesting, NaN, odd codes)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.runtime.invoke import decode_result, plugin_error
from cni.spec.errors import CNIError, DecodingFailure

NASTY = [
    b"[" * 5000 + b"]" * 5000,
    b'{"cniVersion": "1.0.0", "ips": [{"address": NaN}]}',
    b'{"code": 1e400, "msg": "x"}',
    b'{"code": "7", "msg": ["x"]}',
    b"\xff\xfe",
    b"",
    b'{"cniVersion": "1.0.0", "routes": [{"dst": 5}]}',
    b'"\\ud800"',
]


@pytest.mark.parametrize("stdout", [s for s in NASTY if not s.startswith(b'{"code"')])
def test_an_unreadable_result_is_a_decoding_failure(stdout):
    with pytest.raises(DecodingFailure):
        decode_result(stdout, "1.0.0")


@pytest.mark.parametrize("stdout", NASTY)
def test_an_unreadable_error_is_still_a_cni_error(stdout):
    assert isinstance(plugin_error(1, stdout, b"it broke"), CNIError)


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.binary(max_size=300)
    | st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
        ),
    ).map(lambda v: repr(v).encode())
)
def test_any_output_is_a_result_or_a_cni_error(stdout):
    try:
        assert isinstance(decode_result(stdout, "1.0.0"), dict)
    except CNIError:
        pass
    assert isinstance(plugin_error(1, stdout, b""), CNIError)
