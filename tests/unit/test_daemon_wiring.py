"""pycnid's start-up wiring (pycnid/wiring.py) on a real SqliteStore: the store and the
node's deps open in a fixed order, each stop registered as it starts and run in reverse;
handlers get one typed HandlerDeps; plugins/base.py does not import the daemon."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from cni.spec.errors import InvalidConfig
from common.metrics import Registry
from plugins.base import HandlerDeps
from pycnid.config import parse_daemon_config
from pycnid.wiring import PLUGINS, Lifecycle, build_plugins, wire_node


def sqlite_config(tmp_path, **extra):
    return parse_daemon_config(
        {
            "nodeName": "node1",
            "stateDir": str(tmp_path),
            **extra,
            "store": {"type": "sqlite", "path": str(tmp_path / "s.db")},
        }
    )


def stop_names(life: Lifecycle) -> list[str]:
    return [stop.__qualname__ for stop in life.on_shutdown]


def test_the_store_then_liveness_then_housekeeping_each_stop_as_it_starts(tmp_path):
    life = Lifecycle("node1", Registry())
    wired = wire_node(sqlite_config(tmp_path), life)
    deps = wired.deps
    try:
        assert life.on_shutdown == [
            deps.store.close,
            deps.node.liveness.stop,
            wired.housekeeping.stop,
        ]  # SQLite: no reaper, guard, watch
        assert deps.node_name == "node1" and deps.metrics is life.metrics
        assert deps.leases.store is deps.node.store and wired.pool_watch is None
    finally:
        life.shut_down()


def test_the_daemons_loops_count_their_failures_on_its_registry(tmp_path):
    """pycni_loop_errors_total{loop} counts the failed steps of housekeeping's loops too."""
    life = Lifecycle("node1", Registry())
    wired = wire_node(sqlite_config(tmp_path), life)
    try:
        wired.housekeeping.rounds.failed(RuntimeError("a bug"))
        wired.housekeeping.doubt.failed(RuntimeError("a bug"))
        text = life.metrics.render()
        assert 'pycni_loop_errors_total{loop="ipam-housekeeping"} 1' in text, text
        assert 'pycni_loop_errors_total{loop="ipam-in-doubt"} 1' in text, text
    finally:
        life.shut_down()


def test_a_failed_start_up_leaves_the_stops_of_what_started(tmp_path):
    life = Lifecycle("node1", Registry())
    with pytest.raises(InvalidConfig, match="ipam.metricsInterval"):
        wire_node(sqlite_config(tmp_path, ipam={"metricsInterval": 0}), life)
    assert stop_names(life) == ["SqliteStore.close", "Liveness.stop"]
    life.shut_down()


def test_shutdown_runs_the_stops_in_reverse_and_past_a_failing_one(caplog):
    ran: list[str] = []

    def failing() -> None:
        ran.append("failing")
        raise RuntimeError("boom")

    life = Lifecycle(
        "node1", Registry(), [lambda: ran.append("first"), failing, lambda: ran.append("last")]
    )
    with caplog.at_level(logging.ERROR, logger="pycnid"):
        life.shut_down()
    assert ran == ["last", "failing", "first"]
    assert "shutdown hook failed" in caplog.text


def test_every_handler_of_this_build_is_created_and_closed_at_shutdown(tmp_path):
    life = Lifecycle("node1", Registry())
    deps = wire_node(sqlite_config(tmp_path), life).deps
    before = len(life.on_shutdown)
    plugins = build_plugins(deps, life)
    try:
        assert plugins is deps.plugins and sorted(plugins) == sorted(PLUGINS)
        assert {"ipam", "bridge", "svc"} <= set(plugins)
        assert life.on_shutdown[before:] == [plugins[name].close for name in PLUGINS]
        assert isinstance(deps, HandlerDeps)
    finally:
        life.shut_down()


def test_the_plugin_side_does_not_import_the_daemon():
    code = (
        "import sys, plugins.base, plugins.ipam.plugin\n"
        "print(sorted(m for m in sys.modules if m.startswith('pycnid')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
