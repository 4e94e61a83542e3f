"""The pycni-ipam handler in-process (as pycni-bridge delegates to it), on a real SqliteStore."""

from __future__ import annotations

import json

import pytest

from cni.spec.errors import CheckFailed, NotAvailable
from cni.spec.request import Request, parse_config, parse_env
from common.metrics import Registry
from plugins.base import InjectedFault
from plugins.bridge.delegate import delegate
from plugins.ipam import plugin as ipam_plugin
from pycnid.config import parse_daemon_config
from pycnid.wiring import Lifecycle, wire_node


@pytest.fixture
def life():
    life = Lifecycle("node1", Registry())
    yield life
    life.shut_down()


@pytest.fixture
def deps(tmp_path, life):
    config = parse_daemon_config(
        {
            "nodeName": "node1",
            "stateDir": str(tmp_path),
            "faultInjection": True,
            "store": {"type": "sqlite", "path": str(tmp_path / "s.db")},
        }
    )
    deps = wire_node(config, life).deps
    deps.plugins["ipam"] = ipam_plugin.create(deps)
    return deps


def request(command: str, config: dict, cid: str = "c1", args: str = "") -> Request:
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": "/proc/self/ns/net",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": args,
        "CNI_PATH": "/nonexistent",
    }
    if command in ("STATUS", "GC"):
        env = {"CNI_COMMAND": command, "CNI_PATH": "/nonexistent"}
    raw = json.dumps(config).encode()
    return Request(
        env=parse_env(env), config=parse_config(raw, command), raw_env=env, raw_config=raw
    )


CONF = {
    "cniVersion": "1.1.0",
    "name": "net",
    "type": "pycni-bridge",
    "ipam": {
        "type": "pycni-ipam",
        "ranges": [[{"subnet": "10.30.0.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
    },
}


def test_bridge_delegation_runs_in_process(deps):
    result = delegate(deps.plugins, request("ADD", CONF), "ADD")
    assert result == {
        "cniVersion": "1.1.0",
        "ips": [{"address": "10.30.0.2/24", "gateway": "10.30.0.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {},
    }
    delegate(deps.plugins, request("CHECK", CONF), "CHECK")  # no prevResult: lease only
    delegate(deps.plugins, request("DEL", CONF), "DEL")
    with pytest.raises(CheckFailed, match="no address lease for net/c1/eth0"):
        delegate(deps.plugins, request("CHECK", CONF), "CHECK")


def test_wiring_shares_the_store_and_closes_it_at_shutdown(deps, life):
    store = deps.store
    assert store.name.startswith("sqlite:") and deps.leases.node == "node1"
    assert store.close in life.on_shutdown


def test_fault_after_commit_releases_the_lease(deps):
    plugin = deps.plugins["ipam"]
    with pytest.raises(InjectedFault):
        plugin.add(request("ADD", CONF, args="PYCNI_FAULT=ipam-result"))
    assert deps.leases.handles("net") == []
    assert deps.faults.steps_seen[-2:] == ["ipam-allocate", "ipam-result"]


def test_repeated_add_that_fails_late_keeps_the_existing_lease(deps):
    plugin = deps.plugins["ipam"]
    plugin.add(request("ADD", CONF))
    with pytest.raises(InjectedFault):
        plugin.add(request("ADD", CONF, args="PYCNI_FAULT=ipam-result"))
    assert len(deps.leases.handles("net")) == 1  # not ours to undo


def test_status_is_not_available_when_the_store_is_gone(deps):
    plugin = deps.plugins["ipam"]
    plugin.status(request("STATUS", CONF))
    deps.store.close()
    with pytest.raises(NotAvailable) as info:
        plugin.status(request("STATUS", CONF))
    assert info.value.code == 50 and "sqlite:" in info.value.msg


def test_metrics_count_conflicts(deps):
    counter = deps.metrics.counter("pycni_ipam_cas_conflicts_total", "")
    deps.leases.on_conflict()
    assert counter.value() == 1


def test_del_needs_no_valid_ranges(deps):
    plugin = deps.plugins["ipam"]
    plugin.add(request("ADD", CONF))
    broken = {**CONF, "ipam": {"type": "pycni-ipam", "ranges": "garbage"}}
    plugin.delete(request("DEL", broken))  # DEL releases by handle alone
    plugin.delete(request("DEL", broken))
    assert deps.leases.handles("net") == []
