"""`make bench-svc-e2e` must keep working: at its smallest (one create, 50 Services, two
kernel-polled updates and creates) every figure is measured (no timeout, no missing number), the
programmed count is exact, and the run leaves no namespace or temp dir behind. No timing is
asserted (benchmarks are not tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.etcd]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_svc_e2e_measures_every_figure_and_leaves_no_namespace(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the benchmark creates network namespaces: needs root")
    cmd = [
        sys.executable,
        "-m",
        "bench.svc_e2e",
        "--reps",
        "1",
        "--services",
        "50",
        "--updates",
        "2",
        "--timeout",
        "60",
        "--results-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "svc create -> first connect" in proc.stdout
    report = json.loads((tmp_path / "svc-e2e-latest.json").read_text())
    create = report["create"]
    assert len(create["runs"]) == 1 and create["create_to_connect"]["p50"] > 0
    run = create["runs"][0]
    assert run["create_to_connect"] == pytest.approx(run["cli"] + run["after_cli"])
    scale = report["scale"]
    assert (scale["services"], scale["endpoints_each"]) == (50, 5)
    assert scale["write_to_programmed"] is not None, scale
    assert scale["cold"]["exec_to_programmed"] is not None and scale["cold"]["passes"] >= 1
    cold = scale["cold"]
    assert cold["logged"] and cold["logged"][0]["kind"] == "rendered", cold["logged"]
    assert cold["memory_2s_later"]["VmHWM"] >= cold["memory_2s_later"]["VmRSS"] > 0
    for figures in (scale["update"], scale["create"]):
        assert len(figures["runs"]) == 2 and figures["timeouts"] == 0, figures
    assert all(run["in_service_ips"] for run in scale["create"]["runs"])
    assert scale["rss_kib_before"] > 0 and scale["rss_kib_programmed"] > 0
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = {ln.split()[0] for ln in names.splitlines() if ln.strip()}
    assert len(report["namespaces"]) >= 5 and left.isdisjoint(report["namespaces"])
    assert not os.path.exists(report["sandbox"]["workdir"])
