"""`pycni daemon` runs pycnid: it serves `pycni net` requests and stops cleanly on SIGTERM."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.fixtures.cnirun import IP, REPO, Runner, pod_ipv4, write_network
from tests.fixtures.daemon import daemon_config

pytestmark = pytest.mark.netns


def wait_for_socket(path: str, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"pycni daemon exited with {proc.returncode}"
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(path)
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"pycni daemon did not listen on {path} within {timeout}s")


def test_pycni_daemon_serves_and_stops_on_sigterm(node, netns_factory, tmp_path, cni_path):
    if importlib.util.find_spec("plugins.ipam.plugin") is None:
        pytest.skip("pycni-ipam has not landed yet")
    workdir = str(tmp_path / "daemon")
    os.makedirs(workdir)
    config = daemon_config(workdir)
    config_file = os.path.join(workdir, "pycnid.json")
    with open(config_file, "w") as fh:
        json.dump(config, fh)
    log = open(os.path.join(workdir, "log"), "wb")
    proc = subprocess.Popen(
        [
            IP,
            "netns",
            "exec",
            node.name,
            sys.executable,
            "-m",
            "cli",
            "daemon",
            "--config",
            config_file,
        ],
        env={**os.environ, "PYTHONPATH": REPO},
        stdout=log,
        stderr=log,
    )
    try:
        wait_for_socket(config["socket"], proc)
        runner = Runner("pycni", node, str(tmp_path / "net.d"), str(tmp_path / "cache"), cni_path)
        write_network(
            runner.conf_dir,
            {
                "cniVersion": "1.0.0",
                "name": "dnet",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": "dbr0",
                        "isGateway": True,
                        "ipam": {
                            "type": "pycni-ipam",
                            "daemonSocket": config["socket"],
                            "ranges": [[{"subnet": "10.74.0.0/24"}]],
                        },
                    }
                ],
            },
        )
        pod = netns_factory("pod")
        assert pod_ipv4(runner.must("add", "dnet", pod.path).json).startswith("10.74.0.")
        runner.must("del", "dnet", pod.path)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
