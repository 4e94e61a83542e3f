"""pycnid watches the pool records in etcd (ipam/leases/pool_watch.py): an operator's
`pycni ipam pool add / set --disabled / rm` reaches the node's cache at once (an ADD on the
disabled pool fails without losing a compare first), and the watch resumes after etcd is
restarted."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from tests.cluster.load import ipam, pycni_ipam_cli
from tests.fixtures.waiting import wait_for

pytestmark = [pytest.mark.netns, pytest.mark.etcd, pytest.mark.slow]
METRICS = "127.0.0.1:9464"  # in the node's own namespace: nothing else listens there
POOLS = "/pycni/v1/pools/"
SCRAPE = (
    "import urllib.request,sys;"
    "sys.stdout.write(urllib.request.urlopen('http://%s/metrics',timeout=5).read().decode())"
)


def scrape(node) -> dict[str, float]:
    """The daemon's metrics (fetched inside the node namespace) as {'name{labels}': value}."""
    out = subprocess.run(
        ["ip", "netns", "exec", node.host.ns.name, sys.executable, "-c", SCRAPE % METRICS],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert out.returncode == 0, out.stderr
    samples = {}
    for line in out.stdout.splitlines():
        match = re.match(r"^(\S+) (\S+)$", line)
        if match and not line.startswith("#"):
            samples[match.group(1)] = float(match.group(2))
    return samples


def watch_revision(node) -> float:
    return scrape(node).get("pycni_ipam_pool_watch_revision", 0.0)


def watch_events(node, kind: str) -> float:
    return scrape(node).get(f'pycni_ipam_pool_watch_events_total{{kind="{kind}"}}', 0.0)


def pool_revision(cluster, name: str) -> int:
    return cluster.etcd.dump(POOLS)[POOLS + name][1]


def cli(node, *args: str) -> None:
    out = pycni_ipam_cli(node, "pool", *args)
    assert out.returncode == 0, out.stdout + out.stderr


def pool_conf(*pools: str) -> dict:
    return {
        "cniVersion": "1.1.0",
        "name": "watchnet",
        "type": "ptp",
        "ipam": {"type": "pycni-ipam", "pools": list(pools)},
    }


def seen(node, cluster, name: str) -> bool:
    """The watch has reached the pool record's current revision."""
    return watch_revision(node) >= pool_revision(cluster, name)


def test_pool_changes_reach_the_daemon_at_once(make_cluster, cni_bin):
    cluster = make_cluster(nodes=1, metricsAddress=METRICS)
    node = cluster.nodes[0]
    wait_for("the pool watch", lambda: watch_revision(node) > 0)
    started = watch_revision(node)

    cli(node, "add", "wpool", "--cidr", "10.97.0.0/24", "--block-size", "28")
    wait_for("the pool add event", lambda: seen(node, cluster, "wpool"))
    assert watch_events(node, "put") == 1 and watch_revision(node) > started
    first = ipam(cni_bin, node, "ADD", pool_conf("wpool"), "a")
    assert first.ok, first.run.stdout

    cli(node, "set", "wpool", "--disabled")
    wait_for("the pool set event", lambda: seen(node, cluster, "wpool"))
    assert watch_events(node, "put") == 2
    before = scrape(node)
    refused = ipam(cni_bin, node, "ADD", pool_conf("wpool"), "b")
    assert refused.code == 101, refused.run.stdout
    assert "pool disabled" in refused.run.json.get("details", ""), refused.run.json
    after = scrape(node)
    for counter in ("pycni_ipam_cas_conflicts_total", "pycni_ipam_cas_retries_total"):
        assert after.get(counter, 0) == before.get(counter, 0), counter  # no lost compare

    cli(node, "add", "spare", "--cidr", "10.98.0.0/24")
    cli(node, "rm", "spare")
    wait_for("the pool rm event", lambda: watch_events(node, "delete") == 1)
    gone = ipam(cni_bin, node, "ADD", pool_conf("spare"), "c")
    assert gone.code == 7 and "spare" in gone.run.json["msg"], gone.run.stdout
    assert ipam(cni_bin, node, "DEL", pool_conf("wpool"), "a").ok


def test_watch_resumes_after_etcd_restart(make_cluster):
    cluster = make_cluster(nodes=1, metricsAddress=METRICS)
    node, etcd = cluster.nodes[0], cluster.etcd.members[0]
    cli(node, "add", "before", "--cidr", "10.97.0.0/24")
    wait_for("the first event", lambda: seen(node, cluster, "before"))
    restarted_at = watch_revision(node)

    etcd.stop()
    time.sleep(1.0)  # the stream breaks and the watch retries against a dead member
    etcd.start()
    cli(node, "add", "after", "--cidr", "10.98.0.0/24")
    wait_for("the event after the restart", lambda: seen(node, cluster, "after"), timeout=15)
    assert watch_revision(node) > restarted_at
    assert watch_events(node, "put") == 2
    assert "pool watch resumed" in node.daemon.log()
