"""healthCheckNodePort with real HTTP: pycnid's proxy (ProxySync over a SQLite store, in a node
namespace) serves the port of an externalTrafficPolicy Local NodePort Service, and a client in
another namespace asks the node's IPv4 and IPv6 address, as a cloud load balancer would:

200 with ``localEndpoints`` 1 while the node's endpoint is ready; 503 with 0 once it is
drained (terminating: the node leaves the load balancer while its connections finish); 200
when it is ready again; 503 once the endpoint is gone; and nothing listens after the Service
is removed. The JSON is kube-proxy's. While the kernel refuses the proxy's table (another
process owns a table of that name) the answer turns 503 with ``serviceProxyHealthy`` false
after the health timeout, and 200 again once a pass goes in; under ``nodePortAddresses`` the
port listens on the node's addresses inside them only."""

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
import json, sys
from services.proxy.config import parse_proxy_config
from services.proxy.sync import ProxySync
from common.metrics import Registry
from store.sqlite import SqliteStore
section = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
config = parse_proxy_config({"services": {"proxy": True, **section}})
resync = float(sys.argv[2]) if len(sys.argv) > 2 else 600.0
sync = ProxySync("n1", SqliteStore(sys.argv[1]), Registry(), resync, config).start()
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


def answered(lb, status: int, count: int, healthy: bool = True, urls=URLS) -> bool:
    body = {
        "service": {"namespace": "default", "name": "web"},
        "localEndpoints": count,
        "serviceProxyHealthy": healthy,
    }
    return all(ask(lb, url) == (status, body, "application/json") for url in urls)


def setup_records(tmp_path: Path) -> SqliteStore:
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
    return store


def start_proxy(node, tmp_path: Path, resync: float, section: dict) -> subprocess.Popen:
    db, config = str(tmp_path / "store.db"), json.dumps(section)
    command = ["ip", "netns", "exec", node.name, sys.executable, "-c", PROXY, db, str(resync)]
    return subprocess.Popen([*command, config], cwd=ROOT, stdin=subprocess.PIPE)


def test_200_with_a_ready_local_endpoint_503_without_and_gone_with_the_service(nodes, tmp_path):
    node, lb = nodes
    store = setup_records(tmp_path)
    proxy = start_proxy(node, tmp_path, 600.0, {})
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


def test_503_and_unhealthy_while_the_kernel_refuses_the_proxys_table(nodes, tmp_path):
    """Another process holds an owner table named pycni-svc (the kernel refuses every other
    process's change to it): the IPv4 pass is refused again and again; after the health
    timeout (twice the 1 s resync) the answer is 503, serviceProxyHealthy false, though the
    node has its endpoint; once the owner exits its table goes, a pass goes in: 200."""
    node, lb = nodes
    owner = subprocess.Popen(
        ["ip", "netns", "exec", node.name, "nft", "-i"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    owner.stdin.write("add table ip pycni-svc { flags owner; }\n")
    owner.stdin.flush()
    wait_for("the owner table", lambda: "pycni-svc" in node.run("nft list tables").stdout)
    store = setup_records(tmp_path)
    proxy = start_proxy(node, tmp_path, 1.0, {})
    try:
        wait_for("503, unhealthy", lambda: answered(lb, 503, 1, healthy=False), timeout=30)
        owner.stdin.close()
        owner.wait(timeout=10)
        wait_for("200 once a pass goes in", lambda: answered(lb, 200, 1), timeout=30)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if not owner.stdin.closed:
            owner.stdin.close()
        proxy.communicate(timeout=30)
        store.close()
    assert proxy.returncode == 0


def test_node_port_addresses_narrow_where_the_health_check_listens(nodes, tmp_path):
    node, lb = nodes
    node.run("ip addr add 192.168.0.3/24 dev v0")  # a second address inside the CIDR
    store = setup_records(tmp_path)
    proxy = start_proxy(node, tmp_path, 600.0, {"nodePortAddresses": ["192.168.0.2/32"]})
    inside, v6 = URLS
    other = inside.replace("192.168.0.2", "192.168.0.3")
    try:
        wait_for("200 on the address inside", lambda: answered(lb, 200, 1, urls=[inside]))
        assert ask(lb, v6)[0] == 0 and ask(lb, other)[0] == 0  # nothing listens there
    finally:
        proxy.communicate(timeout=30)
        store.close()
    assert proxy.returncode == 0
