"""pycnid's config file under generated input: any JSON object gives a DaemonConfig or an
InvalidConfig (code 7) naming the key, never another exception (pycnid would die at start with
a traceback instead of a message)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.spec.errors import InvalidConfig
from kube.config import KEYS as KUBE_KEYS
from pycnid.config import SectionInvalid, parse_daemon_config

ROOT = Path(__file__).resolve().parents[2]

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
        "username": st.text(max_size=6) | VALUES,
        "passwordFile": st.text(max_size=6) | VALUES,
        "requestTimeout": VALUES,
    },
)
# The kubernetes and networkPolicy sections: their own keys with any value, or anything.
KUBERNETES = st.dictionaries(st.sampled_from([*KUBE_KEYS, "x"]), VALUES, max_size=4) | VALUES
NETWORK_POLICY = (
    st.dictionaries(
        st.sampled_from(["enforce", "resyncInterval", "existingConnections", "x"]),
        st.sampled_from(["keep", "purge"]) | VALUES,
        max_size=3,
    )
    | VALUES
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
        "kubernetes": KUBERNETES,
        "networkPolicy": NETWORK_POLICY,
    },
)


@settings(max_examples=400, deadline=None, database=None)
@given(CONFIG)
def test_any_config_parses_or_is_code_7(data):
    try:
        config = parse_daemon_config(data)
    except SectionInvalid as err:  # a section's parser names the key in its own words
        assert err.code == 7 and ("'kubernetes" in err.msg or "'networkPolicy" in err.msg)
    except InvalidConfig as err:
        assert err.code == 7 and "daemon config" in err.msg
    else:
        assert all(isinstance(e, str) for e in config.store.endpoints)
        assert config.workers >= 1 and config.receive_timeout > 0
        if config.kube is not None:
            assert config.kube.page_size >= 1 and config.kube.watch_timeout >= 1
            assert config.kube.resync_interval > 0 and config.kube.request_timeout > 0
            assert config.kube.kubeconfig is None or isinstance(config.kube.kubeconfig, str)


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


def test_the_sections_are_parsed_at_load_into_typed_fields():
    config = parse_daemon_config(
        {
            "nodeAddress": "10.0.0.11",
            "nodeLabels": {"zone": "a"},
            "ipam": {"bufferSize": 3, "housekeepingInterval": 5},
            "overlay": {"backend": "vxlan", "vni": 7},
            "services": {"proxy": True, "resyncInterval": 12},
        }
    )
    assert (config.node.address, config.node.labels, config.node.buffer_size) == (
        "10.0.0.11",
        {"zone": "a"},
        3,
    )
    assert config.ipam.labels == {"zone": "a"} and config.ipam.housekeeping_interval == 5.0
    assert config.overlay is not None and (config.overlay.backend, config.overlay.vni) == (
        "vxlan",
        7,
    )
    assert config.proxy is not None and config.proxy.resync_interval == 12.0
    plain = parse_daemon_config({})
    assert plain.node.address is None  # found at start-up: nodes.options.calc_node_address
    assert (plain.overlay, plain.proxy) == (None, None)


@pytest.mark.parametrize(
    "data, key",
    [
        ({"nodeLabels": {"a": 1}}, "'nodeLabels'"),
        ({"nodeAddress": 5}, "'nodeAddress'"),
        ({"ipam": []}, "'ipam'"),
        ({"ipam": {"bufferSize": -1}}, "'ipam.bufferSize'"),
        ({"ipam": {"housekeepingInterval": "1h"}}, "'ipam.housekeepingInterval'"),
        ({"overlay": {"backend": "gre"}}, "'overlay.backend'"),
        ({"overlay": {"backend": "vxlan", "bogus": 1}}, "'overlay.bogus'"),
        ({"services": {"proxy": "yes"}}, "'services.proxy'"),
    ],
)
def test_a_bad_section_is_refused_at_load_naming_the_key(data, key):
    with pytest.raises(SectionInvalid, match=key) as caught:
        parse_daemon_config({**data, "logLevel": "debug"})
    assert caught.value.code == 7 and caught.value.log_level == "debug"


def start_pycnid(tmp_path, data: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "pycnid.json"
    path.write_text(json.dumps({"stateDir": str(tmp_path), **data}))
    return subprocess.run(
        [sys.executable, "-m", "pycnid.main", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_pycnid_exits_2_on_its_own_keys_and_1_logged_on_a_bad_section(tmp_path):
    """A bad daemon key: ``pycnid: <error>``, exit 2; a bad section: a failed start (exit 1,
    logged), and nothing opened (no store file in stateDir)."""
    own = start_pycnid(tmp_path, {"workers": 0})
    assert own.returncode == 2
    assert own.stderr.startswith("pycnid: invalid daemon config key 'workers'")
    section = start_pycnid(tmp_path, {"overlay": {"backend": "vxlan", "vni": 0}})
    assert section.returncode == 1, section.stderr
    lines = [json.loads(line) for line in section.stderr.splitlines()]
    assert lines[0]["level"] == "error"
    assert lines[0]["msg"].startswith(
        "pycnid failed to start: invalid daemon config key 'overlay.vni'"
    )
    assert lines[-1]["msg"] == "pycnid stopped"
    assert not (tmp_path / "store.db").exists()


def test_the_command_line_overrides_node_name_and_socket():
    """A DaemonSet passes the Pod's spec.nodeName as ``--node-name $(NODE_NAME)``
    (conf/kubernetes/daemonset.yaml): it wins over the file's nodeName, and the file's keys
    stay as they are when it is not given."""
    from pycnid.main import apply_overrides, parse_args

    config = parse_daemon_config({"nodeName": "file-name", "socket": "/run/a.sock"})
    kept = apply_overrides(config, parse_args(["--config", "x.json"]))
    assert (kept.node_name, kept.socket) == ("file-name", "/run/a.sock")
    given_ = apply_overrides(config, parse_args(["--node-name", "node-7", "--socket", "/b.sock"]))
    assert (given_.node_name, given_.socket) == ("node-7", "/b.sock")


def test_pycni_daemon_passes_node_name_on(monkeypatch):
    from click.testing import CliRunner

    import pycnid.main
    from cli.daemon import command

    seen = []
    monkeypatch.setattr(pycnid.main, "main", seen.append)
    result = CliRunner().invoke(command, ["--config", "c.json", "--node-name", "node-7"])
    assert result.exit_code == 0, result.output
    assert seen == [["--config", "c.json", "--node-name", "node-7"]]
