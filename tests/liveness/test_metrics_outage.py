"""`/metrics` while etcd is down, when operators need it most: a real pycnid on a real etcd, etcd
SIGKILLed (connection refused) or SIGSTOPped (never answers). The scrape still answers, from the
last good snapshot of the pools and blocks, with the failure gauge at 1 and a growing snapshot age;
a scraper that disconnects mid-response leaves no traceback in the daemon's log."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cluster.load import pycni_ipam_cli
from tests.fixtures.waiting import wait_for

pytestmark = [pytest.mark.netns, pytest.mark.etcd, pytest.mark.slow]
METRICS = "127.0.0.1:9464"  # in the node's own namespace: nothing else listens there
INTERVAL = 0.3  # ipam.metricsInterval: background refresh of the store-backed figures
CLIENT_TIMEOUT = 8  # a hang guard (under Prometheus' 10 s default), not a performance bound
FAILED = "pycni_ipam_usage_refresh_failed"
AGE = "pycni_ipam_usage_age_seconds"
SIZE = 'pycni_ipam_pool_size{pool="mpool"}'
# prints the body, then the scrape's wall time in ms on stderr (measured inside the namespace)
SCRAPE = (
    "import sys,time,urllib.request;t=time.monotonic();"
    "b=urllib.request.urlopen('http://%s/metrics',timeout=%d).read().decode();"
    "sys.stderr.write('%%.1f'%%((time.monotonic()-t)*1000));sys.stdout.write(b)"
)
# sends a scrape request and resets the connection at once (SO_LINGER 0: RST, not FIN)
HANG_UP = (
    "import socket,struct;host,port='%s'.split(':');"
    "s=socket.create_connection((host,int(port)));"
    "s.sendall(b'GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n');"
    "s.setsockopt(socket.SOL_SOCKET,socket.SO_LINGER,struct.pack('ii',1,0));s.close()"
)


def in_node(node, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", "netns", "exec", node.host.ns.name, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT + 5,
    )


def scrape(node, took: list[float] | None = None) -> dict[str, float]:
    out = in_node(node, SCRAPE % (METRICS, CLIENT_TIMEOUT))
    assert out.returncode == 0, out.stderr
    if took is not None:
        took.append(float(out.stderr))
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in out.stdout.splitlines())
        if name and not name.startswith("#")
    }


def pool_figures(samples: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in samples.items() if 'pool="mpool"' in k}


@pytest.fixture
def node_with_pool(make_cluster):
    cluster = make_cluster(nodes=1, metricsAddress=METRICS, ipam={"metricsInterval": INTERVAL})
    node = cluster.nodes[0]
    out = pycni_ipam_cli(node, "pool", "add", "mpool", "--cidr", "10.98.0.0/24")
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for("the pool in the snapshot", lambda: SIZE in scrape(node))
    return cluster, node


@pytest.mark.parametrize("outage", ["killed", "paused"])
def test_scrape_answers_from_the_last_snapshot_while_etcd_is_down(node_with_pool, outage):
    cluster, node = node_with_pool
    etcd = cluster.etcd.members[0]
    took: list[float] = []
    before = scrape(node, took)
    assert before[FAILED] == 0 and before[SIZE] > 0
    try:
        etcd.kill() if outage == "killed" else etcd.pause()
        down = wait_for(
            "a failed refresh", lambda: (s := scrape(node, took))[FAILED] == 1 and s, 20, step=0.3
        )
        later = wait_for(
            "the snapshot to age",
            lambda: (s := scrape(node, took))[AGE] > down[AGE] and s,
            10,
            step=0.3,
        )
    finally:
        etcd.resume()  # SIGCONT: a paused member must not outlive the test
    assert pool_figures(down) == pool_figures(later) == pool_figures(before)
    assert later[FAILED] == 1
    print(
        f"scrape ms during the outage ({outage}): max {max(took):.1f}, "
        f"median {sorted(took)[len(took) // 2]:.1f}, n={len(took)}"
    )


def test_a_scraper_that_hangs_up_leaves_no_traceback(node_with_pool):
    cluster, node = node_with_pool
    etcd = cluster.etcd.members[0]
    etcd.kill()
    try:
        wait_for("a failed refresh", lambda: scrape(node)[FAILED] == 1, 20, step=0.3)
        for _ in range(5):
            out = in_node(node, HANG_UP % METRICS)
            assert out.returncode == 0, out.stderr
        assert scrape(node)[FAILED] == 1  # still serving
    finally:
        etcd.start()  # back for the doctor run that ends the module
    log = node.daemon.log()
    assert "Traceback" not in log, log[-3000:]
    for line in log.splitlines():
        entry = json.loads(line)  # every line is a JSON log line
        if "metrics" in entry["logger"]:
            assert entry["level"] == "debug", entry
