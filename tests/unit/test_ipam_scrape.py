"""pycni-ipam's metrics on pycnid's registry, scraped as Prometheus text after real leases
on a SqliteStore (in-process handler)."""

from __future__ import annotations

import json

import pytest

from cni.spec.request import Request, parse_config, parse_env
from common.metrics import Registry
from plugins.ipam import plugin as ipam_plugin
from pycnid.config import parse_daemon_config
from pycnid.wiring import Lifecycle, wire_node
from tests.fixtures.ipam_pools import put_pool


@pytest.fixture
def wired(tmp_path):
    life = Lifecycle("node1", Registry())
    config = parse_daemon_config(
        {
            "nodeName": "node1",
            "stateDir": str(tmp_path),
            "nodeLabels": {"zone": "a"},
            "ipam": {"housekeepingInterval": 0},
            "store": {"type": "sqlite", "path": str(tmp_path / "s.db")},
        }
    )
    wired = wire_node(config, life)
    wired.deps.plugins["ipam"] = ipam_plugin.create(wired.deps)
    yield wired
    life.shut_down()


@pytest.fixture
def deps(wired):
    return wired.deps


def add(deps, cid: str) -> dict:
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": "/proc/self/ns/net",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "",
        "CNI_PATH": "/nonexistent",
    }
    raw = json.dumps(
        {"cniVersion": "1.1.0", "name": "net", "type": "ptp", "ipam": {"type": "pycni-ipam"}}
    ).encode()
    req = Request(env=parse_env(env), config=parse_config(raw, "ADD"), raw_env=env, raw_config=raw)
    return deps.plugins["ipam"].add(req)


def samples(deps) -> dict[str, float]:
    out = {}
    for line in deps.metrics.render().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_pool_usage_blocks_events_and_latency_are_exposed(wired, deps):
    store = deps.store
    put_pool(
        store, "pa", "10.95.0.0/24", block_size=26, gateway="first", node_selector={"zone": "a"}
    )
    for cid in ("c1", "c2", "c3"):
        add(deps, cid)
    leases = deps.leases
    leases.release(next(r.handle for r in leases.handles("net") if r.handle.container_id == "c3"))
    wired.ipam_metrics.refresh()  # the background thread's round (no endpoint here)
    got = samples(deps)
    assert got['pycni_ipam_pool_size{pool="pa"}'] == 256 - 2 - 4  # net/bcast, 4 gateways
    assert got['pycni_ipam_addresses_in_use{pool="pa"}'] == 2
    assert got['pycni_ipam_addresses_cooling{pool="pa"}'] == 1
    assert got['pycni_ipam_addresses_free{pool="pa"}'] == 250 - 2 - 1
    assert got['pycni_ipam_addresses_borrowed{pool="pa"}'] == 0
    assert got['pycni_ipam_blocks{node="node1",pool="pa"}'] == 1
    assert got['pycni_ipam_block_events_total{event="claim",pool="pa"}'] == 1
    assert got["pycni_ipam_allocation_seconds_count"] == 3
    assert "pycni_ipam_cas_conflicts_total" not in got  # no conflict, no sample yet
