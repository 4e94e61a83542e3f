"""`make soak` must keep working: ~15 s of churn on two nodes prints every report line, finds no
error and a doctor-clean node each, exits 0, and leaves no namespace, process, etcd data dir or
temp dir behind. No timing is asserted (benchmarks are not tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.fixtures.netns import is_ours

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.etcd]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINES = (
    "node1 pycnid VmRSS",
    "node2 pycnid open fds",
    "  slope",
    "ADD p99, minute 1",
    "ADD done",
    "DEL done",
    "svc create done",
    "netpol apply done",
    "ping answered",
    "connect answered",
    "errors (none injected)",
    "node1 pycni doctor",
    "node2 pycni doctor",
)


def test_bench_soak_prints_every_line_exits_0_and_leaves_nothing_behind(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the soak creates network namespaces: needs root")
    cmd = [sys.executable, "-m", "bench.soak", "--minutes", "0.25", "--nodes", "2"]
    cmd += ["--change-every", "3", "--results-dir", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for start in LINES:
        assert any(ln.startswith(start) for ln in lines), (start, proc.stdout)
    report = json.loads((tmp_path / "soak-latest.json").read_text())
    assert report["counts"]["ADD"] >= 1 and report["counts"]["DEL"] >= 1, report["counts"]
    assert report["errors"] == {} and report["doctor"] == {"node1": [], "node2": []}
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [ln.split()[0] for ln in names.splitlines() if ln.strip()]
    assert not [n for n in left if n.startswith(report["namespace_prefix"])], left
    for path in [report["sandbox"]["workdir"], *report["dirs"]]:
        assert not os.path.exists(path), path
    for pid in report["pids"]:
        assert not is_ours(pid), pid
