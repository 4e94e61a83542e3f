"""The executable <-> pycnid framing, the DEL netconf cut to the size limit, the daemon's
socket-path and request-timeout rules (pure parts; the transport itself: tests/daemon)."""

from __future__ import annotations

import json
import os
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.spec import wire
from cni.spec.delconf import DEL_KEYS, netconf_for_del
from cni.spec.errors import InvalidConfig
from pycnid.config import parse_daemon_config
from pycnid.server import prepare_socket_path

ENV = st.dictionaries(
    st.text("CNI_ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=12),
    st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=30),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(ENV, st.binary(max_size=300), st.booleans())
def test_a_request_round_trips_and_announces_its_size(env, stdin, has_fd):
    env = {k: v for k, v in env.items() if "=" not in k}
    request = wire.encode_request("bridge", env, stdin, has_fd)
    assert wire.request_size(request) == len(request)
    assert wire.decode_request(request) == ("bridge", env, stdin, has_fd)
    for cut in (0, 5, len(request) // 2):
        assert wire.request_size(request[:cut]) in (None, len(request))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_are_a_request_or_a_value_error(data):
    try:
        size = wire.request_size(data)
    except ValueError:
        return
    assert size is None or size >= 0
    try:
        wire.decode_request(data)
    except ValueError:
        pass


def test_a_header_announcing_negative_or_huge_lengths_is_refused_or_sized():
    with pytest.raises(ValueError):
        wire.request_size(b"PYCNI1 bridge -5 10 0\n")
    assert wire.request_size(b"PYCNI1 bridge 99999999999 0 1\n") > wire.MAX_REQUEST
    with pytest.raises(ValueError):
        wire.request_size(b"GET / HTTP/1.1")
    with pytest.raises(ValueError):
        wire.request_size(b"PYCNI1 " + b"x" * 300)  # no header is that long


def test_too_large_names_the_size_and_the_limit():
    code, msg, _details = wire.too_large(5_000_000)
    assert code == 7 and "5000000" in msg and str(wire.MAX_REQUEST) in msg


CONF = {
    "cniVersion": "1.0.0",
    "name": "n",
    "type": "pycni-bridge",
    "bridge": "br0",
    "daemonSocket": "/run/x.sock",
    "ipam": {"type": "pycni-ipam", "ranges": [[{"subnet": "10.1.0.0/24"}]]},
}


def test_del_keeps_only_what_del_needs():
    big = {**CONF, "prevResult": {"ips": ["x" * 1000]}, "runtimeConfig": {"a": 1}, "args": {}}
    out = json.loads(netconf_for_del(json.dumps(big).encode(), 10_000))
    assert out == {k: CONF[k] for k in DEL_KEYS}


def test_del_cuts_ipam_to_its_type_when_even_it_is_too_large():
    big = {**CONF, "ipam": {**CONF["ipam"], "x": "y" * 5000}}
    out = json.loads(netconf_for_del(json.dumps(big).encode(), 1000))
    assert out["ipam"] == {"type": "pycni-ipam"} and out["name"] == "n"


def test_del_that_cannot_be_cut_is_none():
    assert netconf_for_del(b"{not json", 1000) is None
    assert netconf_for_del(b"[1, 2]", 1000) is None
    assert netconf_for_del(b"[" * 100_000 + b"]" * 100_000, 10**7) is None
    assert netconf_for_del(json.dumps({**CONF, "name": "n" * 5000}).encode(), 1000) is None


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([*DEL_KEYS, "prevResult", "x", "args"]),
        st.recursive(
            st.none() | st.integers() | st.text(max_size=40),
            lambda kids: (
                st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4)
            ),
        ),
    ),
    st.integers(0, 400),
)
def test_del_netconf_fits_its_budget_or_is_none(config, budget):
    out = netconf_for_del(json.dumps(config).encode(), budget)
    if out is not None:
        assert len(out) <= budget and set(json.loads(out)) <= set(DEL_KEYS)


def test_a_regular_file_at_the_socket_path_is_refused_and_kept(tmp_path):
    path = tmp_path / "pycnid.sock"
    path.write_text("precious")
    with pytest.raises(RuntimeError, match=str(path)):
        prepare_socket_path(str(path))
    assert path.read_text() == "precious"


def test_only_a_socket_nobody_answers_on_is_removed(tmp_path):
    path = str(tmp_path / "pycnid.sock")
    live = socket.socket(socket.AF_UNIX)
    live.bind(path)
    live.listen(1)
    try:
        with pytest.raises(RuntimeError, match="already serving"):
            prepare_socket_path(path)
        assert os.path.exists(path)
    finally:
        live.close()
    prepare_socket_path(path)  # now stale
    assert not os.path.lexists(path)


@pytest.mark.parametrize("value", [0, -1, "10", True, None, float("nan"), float("inf"), 1e9])
def test_a_bad_receive_timeout_is_refused_naming_the_key(value):
    with pytest.raises(InvalidConfig, match="receiveTimeout"):
        parse_daemon_config({"receiveTimeout": value})


def test_the_receive_timeout_defaults_to_ten_seconds():
    assert parse_daemon_config({}).receive_timeout == 10.0
    assert parse_daemon_config({"receiveTimeout": 2}).receive_timeout == 2.0
