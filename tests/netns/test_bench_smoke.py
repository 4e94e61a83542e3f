"""`make bench` must keep working: a tiny run of the harness completes on both sides, wires
every pod, and leaves nothing behind. No timing is asserted (benchmarks are not tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import svc_kube as kube
from bench import svc_shapes as shapes
from services.proxy.elements import calc_elements

pytestmark = [pytest.mark.netns, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_harness_runs_both_sides_without_errors_or_residue(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the benchmark creates network namespaces: needs root")
    cmd = [
        sys.executable,
        "-m",
        "bench.run",
        "--pods",
        "3",
        "--chunks",
        "2",
        "--churn",
        "6",
        "--concurrency",
        "3",
        "--rounds",
        "3",
        "--masq",
        "on",
        "--results-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exec VERSION median" in proc.stdout
    report = json.loads((tmp_path / "latest.json").read_text())
    variant = report["variants"]["ipMasq=true"]
    for side in ("pycni", "reference"):
        lat, churn = variant[side]["latency"], variant[side]["churn"]
        assert lat["error_count"] == 0 and churn["error_count"] == 0, (side, lat, churn)
        assert len(lat["add"]) == 3 and len(lat["del"]) == 3
        assert churn["ips"] == churn["unique_ips"] == 6
        assert churn["residue"] == {"veths": 0, "cni_chains": 0, "set_elements": 0}, side
    assert variant["pycni"]["churn"]["rss_kib"] > 0
    verdicts = {row["verdict"] for row in variant["rows"] if row["goal"] is not None}
    assert verdicts <= {"PASS", "MISS"}  # every goal line was measured on both sides
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    prefix = report["sandbox"]["prefix"]
    assert [ln for ln in names.splitlines() if ln.startswith(prefix)] == []
    assert not os.path.exists(report["sandbox"]["workdir"])


@pytest.mark.etcd
def test_bench_overlay_runs_every_part_and_leaves_no_namespace(tmp_path):
    """`make bench-overlay` at its smallest: every part measures something on both sides (no
    timeout, no missing figure), the kernel held every synthetic peer, nothing is left."""
    if os.geteuid() != 0:
        pytest.skip("the benchmark creates network namespaces: needs root")
    cmd = [
        sys.executable,
        "-m",
        "bench.overlay",
        "--runs",
        "1",
        "--seconds",
        "1",
        "--nodes",
        "3",
        "--rounds",
        "1",
        "--settle",
        "0",
        "--peers",
        "20",
        "--resync",
        "1",  # the steady pass waits for 3 periodic passes: 3 s, not 9 s at the default 3
        "--results-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "overlay-latest.json").read_text())
    for backend in ("vxlan", "host-gw"):
        tp = report["throughput"][backend]
        assert (
            tp["pycni_median"] > 0 and tp["hand_median"] > 0 and tp["verdict"] in ("PASS", "MISS")
        )
    conv = report["convergence"]
    assert conv["join"]["timeouts"] == conv["leave"]["timeouts"] == 0, conv
    assert conv["join"]["n"] == conv["leave"]["n"] == 2
    assert conv["ping"]["timeouts"] == conv["ping_node"]["timeouts"] == 0, conv
    resync = report["resync"]
    assert resync["entries_in_kernel"] == {"routes": 20, "neighs": 20, "fdbs": 20}
    assert resync["write_to_programmed"] is not None and resync["rss_kib"] > 0
    assert resync["cold"]["exec_to_programmed"] is not None
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    prefix = report["sandbox"]["prefix"]
    assert [ln for ln in names.splitlines() if ln.startswith(prefix)] == []
    assert not os.path.exists(report["sandbox"]["workdir"])


def test_bench_svc_loads_both_shapes_and_leaves_no_namespace(tmp_path):
    """`make bench-svc` at its smallest, with the mixed Services: both shapes load on both
    engines (the kernel holds every dispatch element), pycni in two runs each, each update run
    measured, every goal line judged, nothing left."""
    if os.geteuid() != 0:
        pytest.skip("the benchmark creates network namespaces: needs root")
    cmd = [
        sys.executable,
        "-m",
        "bench.svc",
        "--sizes",
        "20,100",
        "--update-at",
        "100",
        "--updates",
        "2",
        "--repeats",
        "2",
        "--results-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "svc-latest.json").read_text())
    runs = report["runs"]
    assert set(runs) == {
        f"{shape}/{engine}/{size}"
        for shape in ("pycni", "kube")
        for engine in ("lib", "bin")
        for size in (20, 100)
    }
    for key, run in runs.items():
        size = int(key.rsplit("/", 1)[1])
        assert run["service_ips_in_kernel"] == shapes.calc_dispatch_count(
            shapes.calc_plan(size)
        ), key
        repeats = 2 if key.startswith("pycni/") else 1  # pycni's full sync: the median run's
        assert len(run["full_runs"]) == repeats, key
        assert len(run["updates"]) == (2 * repeats if size == 100 else 0), key
    plan = shapes.calc_plan(100)  # the proxy's table holds what its model of the plan has
    assert runs["pycni/lib/100"]["elements"] == len(calc_elements(shapes.build_model(plan)))
    assert runs["kube/lib/100"]["chains"] == kube.calc_chain_count(plan)
    assert "mixed Services" in proc.stdout
    judged = [row["verdict"] for row in report["goals"] if row["goal"]]
    assert len(judged) == 4 and set(judged) <= {"PASS", "MISS"}  # every goal line measured
    assert runs["pycni/lib/100"]["rss_kib_built"] > 0
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    prefix = report["sandbox"]["prefix"]
    assert [ln for ln in names.splitlines() if ln.startswith(prefix)] == []
    assert not os.path.exists(report["sandbox"]["workdir"])
