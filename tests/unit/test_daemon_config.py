"""pycnid's config file under generated input: any JSON object gives a DaemonConfig or an
InvalidConfig (code 7) naming the key, never another exception (pycnid would die at start with
a traceback instead of a message)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.spec.errors import InvalidConfig
from pycnid.config import parse_daemon_config

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5000) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
STORE = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["sqlite", "etcd", "x"]) | VALUES,
        "path": VALUES,
        "endpoints": st.lists(st.text(max_size=12), max_size=2) | st.text(max_size=12) | VALUES,
        "ca": VALUES,
        "cert": VALUES,
        "key": VALUES,
        "requestTimeout": VALUES,
    },
)
CONFIG = st.fixed_dictionaries(
    {},
    optional={
        "socket": VALUES,
        "nodeName": VALUES,
        "stateDir": VALUES,
        "store": STORE | VALUES,
        "metricsAddress": VALUES,
        "logLevel": VALUES,
        "faultInjection": VALUES,
        "workers": VALUES,
        "receiveTimeout": VALUES,
    },
)


@settings(max_examples=400, deadline=None, database=None)
@given(CONFIG)
def test_any_config_parses_or_is_code_7(data):
    try:
        config = parse_daemon_config(data)
    except InvalidConfig as err:
        assert err.code == 7 and "daemon config" in err.msg
    else:
        assert all(isinstance(e, str) for e in config.store.endpoints)
        assert config.workers >= 1 and config.receive_timeout > 0


@pytest.mark.parametrize(
    "data, key",
    [
        ({"store": {"type": "etcd", "endpoints": 5}}, "store.endpoints"),
        ({"store": {"type": "etcd", "endpoints": "http://127.0.0.1:2379"}}, "store.endpoints"),
        ({"store": {"path": [1]}}, "store.path"),
        ({"metricsAddress": 5}, "metricsAddress"),
        ({"nodeName": ["n1"]}, "nodeName"),
        ({"socket": 7}, "socket"),
    ],
)
def test_a_key_of_the_wrong_type_is_code_7_naming_it(data, key):
    """A single URL string used to become one endpoint per character; a number, a TypeError."""
    with pytest.raises(InvalidConfig, match=f"'{key}'"):
        parse_daemon_config(data)
