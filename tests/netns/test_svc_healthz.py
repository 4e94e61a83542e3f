"""healthCheckNodePort with real HTTP: pycnid's proxy (ProxySync over a SQLite store, in a node
namespace) serves the port of an externalTrafficPolicy Local NodePort Service, and a client in
another namespace asks the node's IPv4 and IPv6 address, as a cloud load balancer would:

200 with ``localEndpoints`` 1 while the node's endpoint is ready; 503 with 0 once it is
drained (terminating: the node leaves the load balancer while its connections finish); 200
when it is ready again; 503 once the endpoint is gone; and nothing listens after the Service
is removed. The JSON is kube-proxy's."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from services.record import EndpointRecord, ServicePort, ServiceRecord, ServiceSettings
from store.base import Delete, Put
from store.codec import encode
from store.keys import SERVICES_META, pool_key
from store.sqlite import SqliteStore
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.netns
ROOT = Path(__file__).resolve().parents[2]
PROXY = """
import sys
from services.proxy.sync import ProxySync
from common.metrics import Registry
from store.sqlite import SqliteStore
sync = ProxySync("n1", SqliteStore(sys.argv[1]), Registry(), 600.0).start()
sys.stdin.read()
sync.stop()
"""
ASK = """
import json, sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=3) as r:
        print(json.dumps([r.status, json.loads(r.read()), r.headers["Content-Type"]]))
except urllib.error.HTTPError as e:
    print(json.dumps([e.code, json.loads(e.read()), e.headers["Content-Type"]]))
except OSError as e:
    print(json.dumps([0, str(e), None]))
"""
PORT = 30100
URLS = (f"http://192.168.0.2:{PORT}/healthz", f"http://[fd01::2]:{PORT}/healthz")
SERVICE = ServiceRecord(
    "default",
    "web",
    "NodePort",
    (ServicePort("http", "TCP", 80, 8080, 30080),),
    ("10.96.0.5",),
    (),
    {"app": "web"},
    external_traffic_policy="Local",
    health_check_node_port=PORT,
)
POD = EndpointRecord("default", "web-1", "eth0", ("10.0.0.2",), {"app": "web"}, "n1")


@pytest.fixture
def nodes(netns_factory):
    """node (the proxy) --veth-- lb (the client asking, as a load balancer)."""
    node, lb = netns_factory("hcnode"), netns_factory("hclb")
    node.run(["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", lb.name])
    node.run(
        "ip addr add 192.168.0.2/24 dev v0 && ip addr add fd01::2/64 dev v0 nodad && "
        "ip link set v0 up"
    )
    lb.run(
        "ip addr add 192.168.0.9/24 dev v1 && ip addr add fd01::9/64 dev v1 nodad && "
        "ip link set v1 up"
    )
    return node, lb


def ask(lb, url: str) -> tuple:
    return tuple(json.loads(lb.run([sys.executable, "-c", ASK, url]).stdout))


def answered(lb, status: int, count: int) -> bool:
    body = {
        "service": {"namespace": "default", "name": "web"},
        "localEndpoints": count,
        "serviceProxyHealthy": True,
    }
    return all(ask(lb, url) == (status, body, "application/json") for url in URLS)


def test_200_with_a_ready_local_endpoint_503_without_and_gone_with_the_service(nodes, tmp_path):
    node, lb = nodes
    store = SqliteStore(str(tmp_path / "store.db"))
    store.txn(
        [],
        [
            Put(SERVICES_META, ServiceSettings(("10.96.0.0/16",)).to_bytes()),
            Put(pool_key("pods"), encode({"cidr": "10.0.0.0/16"})),
            Put(SERVICE.key, SERVICE.to_bytes()),
            Put(POD.key, POD.to_bytes()),
        ],
    )
    proxy = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            node.name,
            sys.executable,
            "-c",
            PROXY,
            str(tmp_path / "store.db"),
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
    )
    try:
        wait_for("200 with one local endpoint", lambda: answered(lb, 200, 1), timeout=30)
        drained = replace(POD, ready=False, serving=True, terminating=True)
        store.txn([], [Put(POD.key, drained.to_bytes())])
        wait_for("503 once it is terminating", lambda: answered(lb, 503, 0), timeout=30)
        store.txn([], [Put(POD.key, POD.to_bytes())])
        wait_for("200 when it is ready again", lambda: answered(lb, 200, 1), timeout=30)
        store.txn([], [Delete(POD.key)])
        wait_for("503 once it is gone", lambda: answered(lb, 503, 0), timeout=30)
        store.txn([], [Delete(SERVICE.key)])
        wait_for(
            "nothing listening once the Service is gone",
            lambda: all(ask(lb, url)[0] == 0 for url in URLS),
            timeout=30,
        )
    finally:
        proxy.communicate(timeout=30)
        store.close()
    assert proxy.returncode == 0
