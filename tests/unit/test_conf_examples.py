"""Every example under conf/ is accepted by the parsers pycnid and the plugins really use.

Daemon configs (*.json): ``parse_daemon_config`` with its sections (the node options of
``nodes/options.py``, the IPAM's daemon options of ``plugins/ipam/config.py``, the overlay)
and, for an etcd store, the etcd options (``store/etcd_conn.py``). Conflists: the runtime's
conflist parser, then each plugin object through ``parse_bridge_config`` /
``parse_ipam_config``. A file of an unknown kind fails, so a new example cannot slip in
untested.
"""

from __future__ import annotations

import json
import os

import pytest

from cni.runtime.conflist import conflist_from_bytes
from cni.spec.request import Env, Request
from nodes.options import NodeOptions
from overlay.config import DEFAULT_RESYNC, DEFAULT_VNI, DEFAULT_VXLAN_PORT
from plugins.bridge.config import parse_bridge_config
from plugins.ipam.config import DaemonOptions, parse_ipam_config
from plugins.svc.args import parse_labels, parse_ports
from pycnid.config import parse_daemon_config
from store.etcd_conn import EtcdOptions, parse_options

CONF = os.path.join(os.path.dirname(__file__), "..", "..", "conf")
# conf/kubernetes/ (manifests, the image) has its own test: tests/unit/test_kube_manifests.py
FILES = sorted(n for n in os.listdir(CONF) if os.path.isfile(os.path.join(CONF, n)))


def path(name: str) -> str:
    return os.path.join(CONF, name)


def load(name: str) -> dict:
    with open(path(name), encoding="utf-8") as fh:
        return json.load(fh)


def plugin_request(network: dict, plugin: dict) -> Request:
    config = {"cniVersion": network["cniVersion"], "name": network["name"], **plugin}
    return Request(
        env=Env(command="ADD", container_id="c1", netns="/x", ifname="eth0", args={}),
        config=config,
    )


def test_every_file_is_of_a_known_kind():
    kinds = (".json", ".conflist", ".service", ".conf")
    assert FILES and all(name.endswith(kinds) for name in FILES), FILES
    assert {
        "10-pycni.conflist",
        "20-pycni-cluster.conflist",
        "pycnid.json",
        "pycnid-etcd.json",
        "pycnid.service",
    } <= set(FILES)


@pytest.mark.parametrize("name", [n for n in FILES if n.endswith(".json")])
def test_daemon_config_is_accepted(name):
    raw = load(name)
    config = parse_daemon_config(raw)
    node = config.node
    options = config.ipam
    assert isinstance(node, NodeOptions) and isinstance(options, DaemonOptions)
    if config.store.type == "etcd":
        etcd = parse_options(
            config.store.endpoints,
            config.store.ca,
            config.store.cert,
            config.store.key,
            config.store.options,
        )
        assert etcd.endpoints and etcd.ca and etcd.cert and etcd.key


def test_etcd_example_shows_the_real_defaults():
    """The README says conf/pycnid-etcd.json spells out the defaults: keep that true."""
    raw = load("pycnid-etcd.json")
    config = parse_daemon_config(raw)
    assert config.store.type == "etcd" and len(config.store.endpoints) == 3
    assert all(url.startswith("https://") for url in config.store.endpoints)
    node = config.node
    defaults = NodeOptions()
    assert (
        node.buffer_size,
        node.heartbeat_ttl,
        node.reap_grace,
        node.reap_interval,
        node.add_budget,
    ) == (
        defaults.buffer_size,
        defaults.heartbeat_ttl,
        defaults.reap_grace,
        defaults.reap_interval,
        defaults.add_budget,
    )
    assert node.labels == {"zone": "a"} and node.address == "10.0.0.11"
    options = config.ipam
    assert (options.block_grace, options.housekeeping_interval) == (
        DaemonOptions({}).block_grace,
        DaemonOptions({}).housekeeping_interval,
    )
    etcd = parse_options(
        config.store.endpoints,
        config.store.ca,
        config.store.cert,
        config.store.key,
        config.store.options,
    )
    plain = EtcdOptions(config.store.endpoints)
    assert (etcd.call_timeout, etcd.request_timeout, etcd.status_timeout, etcd.endpoint_retry) == (
        plain.call_timeout,
        plain.request_timeout,
        plain.status_timeout,
        plain.endpoint_retry,
    )
    overlay = config.overlay
    assert overlay is not None and overlay.backend == "vxlan"
    assert (overlay.vni, overlay.port, overlay.resync_interval, overlay.leave_on_stop) == (
        DEFAULT_VNI,
        DEFAULT_VXLAN_PORT,
        DEFAULT_RESYNC,
        False,
    )
    assert set(raw["ipam"]) == {
        "bufferSize",
        "heartbeatTTL",
        "reapGrace",
        "reapInterval",
        "addBudget",
        "blockReturnGrace",
        "housekeepingInterval",
    }


@pytest.mark.parametrize("name", [n for n in FILES if n.endswith(".conflist")])
def test_conflist_and_its_plugins_are_accepted(name):
    with open(path(name), "rb") as fh:
        data = fh.read()
    conflist = conflist_from_bytes(data, path(name))
    network = json.loads(data)
    assert conflist.name == network["name"]
    types = []
    for plugin in network["plugins"]:
        types.append(plugin["type"])
        req = plugin_request(network, plugin)
        if plugin["type"] == "pycni-bridge":
            assert parse_bridge_config(req).has_ipam
        if plugin.get("ipam", {}).get("type") == "pycni-ipam":
            parse_ipam_config(req.config)
        if plugin["type"] == "pycni-svc":  # its args shapes (labels, named ports)
            parse_labels(req.config, {}), parse_ports(req.config)
    assert types[0] == "pycni-bridge"


def test_cluster_conflist_selects_cluster_pools():
    network = load("20-pycni-cluster.conflist")
    ipam = network["plugins"][0]["ipam"]
    cfg = parse_ipam_config({"name": network["name"], "ipam": ipam})
    assert cfg.pools == ("pods-v4",) and cfg.range_sets == ()
    assert cfg.selection.mode == "pools"
    assert network["name"] != load("10-pycni.conflist")["name"]


def test_service_unit_runs_pycnid_with_the_installed_config():
    with open(path("pycnid.service"), encoding="utf-8") as fh:
        unit = fh.read()
    assert "ExecStart=/usr/local/bin/pycnid --config /etc/pycni/pycnid.json" in unit
