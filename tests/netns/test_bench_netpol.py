"""`make bench-netpol` must keep working: at a tiny size (5 policies, 20 Pods) every figure line
is printed with a number (none failed), and the run leaves no namespace, process, etcd data dir
or temp dir behind. No timing is asserted (benchmarks are not tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.fixtures.netns import is_ours

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.etcd]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIGURES = (
    "(a) full sync",
    "(b) policy change -> node2's kernel",
    "    p99",
    "(c) label change, this node's Pod",
    "(d) ADD cost of isolating",
    "(e) first packet",
    "(f) pycnid VmRSS",
)
TINY = ["--policies", "5", "--pods", "20", "--local", "5", "--runs", "1", "--labels", "2"]
TINY += [
    "--changes",
    "2",
    "--adds",
    "2",
    "--connects",
    "50",
    "--rounds",
    "1",
    "--svc-services",
    "50",
]
TINY += ["--remote-services", "5", "--timeout", "60", "--settle", "0.2", "--no-change-wait", "1"]


def test_bench_netpol_prints_every_figure_and_leaves_nothing_behind(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the benchmark creates network namespaces: needs root")
    cmd = [sys.executable, "-m", "bench.netpol", *TINY, "--results-dir", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for figure in FIGURES:
        found = [ln for ln in lines if ln.startswith(figure)]
        assert found and all(("PASS" in ln or "MISS" in ln) for ln in found), proc.stdout
    assert "failed" not in proc.stdout, proc.stdout
    report = json.loads((tmp_path / "netpol-latest.json").read_text())
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = {ln.split()[0] for ln in names.splitlines() if ln.strip()}
    assert len(report["namespaces"]) >= 5 and left.isdisjoint(report["namespaces"])
    assert not any(n.startswith(report["namespace_prefix"]) for n in left), left
    remote, node = report["remote"], report["node"]
    for path in [report["sandbox"]["workdir"], *remote["dirs"]]:
        assert not os.path.exists(path), path
    for pid in [*remote["pids"], *node["pids"]]:
        assert not is_ours(pid), pid
