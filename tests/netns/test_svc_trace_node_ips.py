"""`pycni svc trace` on a node is computed from the inputs its proxy programs from: the store's
records and the node's own addresses, read from the node's netns by the one function the proxy
calls (``services.proxy.inputs.read_local_addresses``). A NodePort Service, dual-stack, on a
node whose record names its first IPv4 address: the proxy's pass (``calc_plan`` over the same
records and addresses, applied with nft inside the node netns) DNATs the NodePort on the
node's second IPv4 address and on its IPv6 address, a real connection reaches the backend
there, and the CLI run in the node's netns traces each of them as that DNAT, not as "not a
Service address"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nodes.record import NodeRecord, node_key
from services.record import EndpointRecord, ServicePort, ServiceRecord, ServiceSettings
from store.base import Put
from store.codec import encode
from store.keys import SERVICES_META, pool_key
from store.sqlite import SqliteStore

pytestmark = pytest.mark.netns
ROOT = Path(__file__).resolve().parents[2]
FIRST, SECOND, V6 = "192.168.0.2", "192.168.1.2", "fd01::2"
BACKEND, BACKEND6 = "10.0.0.2", "fd00::2"
NODE_PORT = 30080
SERVER = """
import socket, socketserver
class H(socketserver.BaseRequestHandler):
    def handle(self):
        me = self.request.getsockname()[0]
        self.request.sendall(me.removeprefix("::ffff:").encode())
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True; daemon_threads = True; address_family = socket.AF_INET6
    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0); super().server_bind()
S(("::", 8080), H).serve_forever()
"""
PASS = """
import subprocess, sys
from services.proxy.inputs import read_local_addresses
from services.proxy.sync import calc_plan
from services.ops.trace import read_records
from store.sqlite import SqliteStore
records = read_records(SqliteStore(sys.argv[1]))
for family in (4, 6):
    plan = calc_plan(records, "n1", family, list(read_local_addresses()), None, set())
    subprocess.run(["nft", "-f", "-"], input=plan.script, text=True, check=True)
"""
CONNECT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:
    print(s.recv(64).decode())
"""


def setup_store(db: Path) -> None:
    service = ServiceRecord(
        "default",
        "web",
        "NodePort",
        (ServicePort("http", "TCP", 80, 8080, NODE_PORT),),
        ("10.96.0.10", "fd96::10"),
        (),
        {"app": "web"},
    )
    pod = EndpointRecord("default", "web-0", "eth0", (BACKEND, BACKEND6), {"app": "web"}, "n1")
    SqliteStore(str(db)).txn(
        [],
        [
            Put(SERVICES_META, ServiceSettings(("10.96.0.0/16", "fd96::/112")).to_bytes()),
            Put(pool_key("pods"), encode({"cidr": "10.0.0.0/24"})),
            Put(pool_key("pods6"), encode({"cidr": "fd00::/64"})),
            Put(node_key("n1"), NodeRecord("n1", FIRST).to_bytes()),
            Put(service.key, service.to_bytes()),
            Put(pod.key, pod.to_bytes()),
        ],
    )


@pytest.fixture
def node(netns_factory, tmp_path):
    """node (two IPv4 addresses and an IPv6 one on a veth, the proxy's table) --veth-- pod
    (the backend, answering with the address it was reached on)."""
    node, pod = netns_factory("tracenode"), netns_factory("tracepod")
    node.run(
        "ip link set lo up && ip link add up0 type veth peer name up1 && ip link set up1 up && "
        "ip link set up0 up && "
        f"ip addr add {FIRST}/24 dev up0 && ip addr add {SECOND}/24 dev up0 && "
        f"ip addr add {V6}/64 dev up0 nodad && "
        f"ip link add v0 type veth peer name v1 netns {pod.name} && ip link set v0 up && "
        "ip addr add 10.0.0.1/24 dev v0 && ip addr add fd00::1/64 dev v0 nodad"
    )
    pod.run(
        f"ip link set lo up && ip link set v1 up && ip addr add {BACKEND}/24 dev v1 && "
        f"ip addr add {BACKEND6}/64 dev v1 nodad && ip route add default via 10.0.0.1 && "
        "ip -6 route add default via fd00::1"
    )
    setup_store(tmp_path / "store.db")
    config = tmp_path / "pycnid.json"
    config.write_text(
        json.dumps(
            {
                "socket": str(tmp_path / "pycnid.sock"),
                "nodeName": "n1",
                "stateDir": str(tmp_path),
                "store": {"type": "sqlite", "path": str(tmp_path / "store.db")},
            }
        )
    )
    server = subprocess.Popen(["ip", "netns", "exec", pod.name, sys.executable, "-c", SERVER])
    try:
        node.run([sys.executable, "-c", PASS, str(tmp_path / "store.db")], cwd=ROOT)
        yield node, config
    finally:
        server.kill()
        server.wait()


def cli_trace(node, config: Path, target: str) -> dict:
    out = node.run(
        [
            sys.executable,
            "-m",
            "cli",
            "svc",
            "trace",
            "--from",
            "203.0.113.9" if "." in target else "2001:db8::9",
            "--to",
            target,
            "--config",
            str(config),
            "--output",
            "json",
        ],
        cwd=ROOT,
    )
    return json.loads(out.stdout)


def connect(node, ip: str) -> str:
    for _ in range(50):  # the server may still be starting
        out = node.run([sys.executable, "-c", CONNECT, ip, str(NODE_PORT)], check=False)
        if out.returncode == 0:
            return out.stdout.strip()
    raise AssertionError(out.stderr)


@pytest.mark.parametrize(
    ("address", "backend"), [(SECOND, BACKEND), (V6, BACKEND6), (FIRST, BACKEND)]
)
def test_trace_dnats_the_nodeport_wherever_the_kernel_does(node, address, backend):
    ns, config = node
    assert connect(ns, address) == backend  # the kernel DNATs it
    host = f"[{address}]" if ":" in address else address
    doc = cli_trace(ns, config, f"{host}:{NODE_PORT}/tcp")
    answer = doc["answer"]
    assert (answer["entry"], answer["verdict"]) == ("NodePort", "dnat"), answer
    assert [c["ip"] for c in answer["choices"]] == [backend]
    assert address in doc["nodeIPs"]
