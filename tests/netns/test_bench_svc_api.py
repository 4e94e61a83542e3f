"""`make bench-svc-api` must keep working: at its smallest (50 Services, two EndpointSlice
changes and two store changes, no settling pause) every figure is measured on both nodes (no
timeout, no missing number), both programmed every Service, and the run leaves no namespace or
temp dir behind. No timing is asserted (benchmarks are not tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.etcd]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIGURES = ("start_to_first_list", "first_list_to_programmed", "start_to_programmed")


def test_bench_svc_api_measures_every_figure_and_leaves_no_namespace(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the benchmark creates network namespaces: needs root")
    cmd = [sys.executable, "-m", "bench.svc_api", "--services", "50", "--updates", "2"]
    cmd += ["--settle", "0", "--timeout", "60", "--results-dir", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for label in ("first list -> all programmed", "VmRSS once programmed", "in the kernel, p50"):
        assert label in proc.stdout, proc.stdout
    assert "timeout" not in proc.stdout and " — " not in proc.stdout, proc.stdout
    report = json.loads((tmp_path / "svc-api-latest.json").read_text())
    scale = report["scale"]
    assert (scale["services"], scale["endpoints_each"]) == (50, 5)
    for side in ("api", "store"):
        node = scale[side]
        assert all(node[key] is not None for key in FIGURES), (side, node)
        assert node["programmed_metric"] == 50, (side, node)
        assert node["first_pass"] is not None and node["first_pass"]["services"] >= 50
        assert node["memory_programmed"]["VmHWM"] >= node["memory_programmed"]["VmRSS"] > 0
        update = node["update"]
        assert len(update["runs"]) == 2 and update["timeouts"] == 0, (side, update)
    api = scale["api"]
    assert set(api["listed_whole"]) == {"services", "endpointslices"}, api
    assert api["list_requests"] == 2 and api["fake_answering_lists"] > 0
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = {ln.split()[0] for ln in names.splitlines() if ln.strip()}
    assert len(report["namespaces"]) >= 4 and left.isdisjoint(report["namespaces"])
    assert not os.path.exists(report["sandbox"]["workdir"])
