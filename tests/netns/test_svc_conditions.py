"""Endpoint conditions with real packets: endpoint records (as pycni-svc and `pycni svc
endpoint set|drain` write them) through the proxy's own path (``Records`` → ``calc_model`` →
the table's transactions, each step a diff on the last as pycnid applies them) into a real
nft, and real TCP connections from a host namespace to the ClusterIP, IPv4 and IPv6:

1. one ready endpoint and one drained (serving, terminating): every connection goes to the
   ready one — the terminating one gets no new connection while a ready one exists;
2. the ready one becomes not ready: the serving terminating one answers every connection;
3. that one stops serving too: no usable endpoint, the connection is rejected.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from services.proxy.model import ProxyModel
from services.proxy.table import render_transaction
from services.proxy.view import Records, calc_model
from services.record import EndpointRecord, ServicePort, ServiceRecord, ServiceSettings
from store.base import KV
from store.keys import SERVICES_META

pytestmark = pytest.mark.netns
SERVER = """
import socket, socketserver
class H(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.sendall(self.request.getsockname()[0].removeprefix("::ffff:").encode())
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True; daemon_threads = True; address_family = socket.AF_INET6
S(("::", 8080), H).serve_forever()
"""
CLIENT = """
import socket, sys
for _ in range(int(sys.argv[3])):
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:
        print(s.recv(64).decode())
"""
WAIT = """
import socket, sys, time
for _ in range(200):
    try: socket.create_connection((sys.argv[1], 8080), 1).close(); break
    except OSError: time.sleep(0.05)
else: sys.exit("no server on " + sys.argv[1])
"""
FAMILIES = {
    4: {"vip": "10.96.0.10", "cidr": "10.96.0.0/16", "pods": ("10.0.0.2", "10.0.0.3")},
    6: {"vip": "fd96::10", "cidr": "fd96::/112", "pods": ("fd00::2", "fd00::3")},
}


def kv(key: str, value: bytes) -> KV:
    return KV(key, value, 1, 1)


def calc_step(family: int, states: tuple[dict, dict]) -> ProxyModel:
    """The model node n1 programs with pods a and b in ``states`` (their conditions)."""
    f = FAMILIES[family]
    records = Records()
    svc = ServiceRecord(
        "ns", "web", "ClusterIP", (ServicePort("http", "TCP", 80, 8080),), (f["vip"],), (),
        {"app": "web"},
    )  # fmt: skip
    records.apply(kv(svc.key, svc.to_bytes()))
    records.apply(kv(SERVICES_META, ServiceSettings((f["cidr"],)).to_bytes()))
    for name, ip, conditions in zip("ab", f["pods"], states, strict=True):
        e = EndpointRecord("ns", name, "eth0", (ip,), {"app": "web"}, "n1", **conditions)
        records.apply(kv(e.key, e.to_bytes()))
    return calc_model(records, "n1", family)


READY = {"ready": True, "serving": True, "terminating": False}
DRAINED = {"ready": False, "serving": True, "terminating": True}
NOT_READY = {"ready": False, "serving": False, "terminating": False}
GONE = {"ready": False, "serving": False, "terminating": True}


@pytest.fixture
def wired(netns_factory):
    """host (client, the table) --veth-- pods (a and b's addresses, one dual-stack server)."""
    host, pods = netns_factory("condhost"), netns_factory("condpods")
    host.run(["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", pods.name])
    host.run(
        "ip addr add 10.0.0.1/24 dev v0 && ip addr add fd00::1/64 dev v0 nodad && "
        "ip link set v0 up && ip route add 10.96.0.0/16 dev v0 && ip route add fd96::/112 dev v0"
    )
    adds = [f"ip addr add {ip}/24 dev v1" for ip in FAMILIES[4]["pods"]]
    adds += [f"ip addr add {ip}/64 dev v1 nodad" for ip in FAMILIES[6]["pods"]]
    pods.run(" && ".join(["ip link set v1 up", *adds]))
    server = subprocess.Popen(["ip", "netns", "exec", pods.name, sys.executable, "-c", SERVER])
    try:
        for f in FAMILIES.values():
            for ip in f["pods"]:
                pods.run([sys.executable, "-c", WAIT, ip])
        yield host
    finally:
        server.kill()
        server.wait()


def connect(host, vip: str, count: int, check: bool = True):
    return host.run([sys.executable, "-c", CLIENT, vip, "80", str(count)], check=check)


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_ready_first_then_serving_terminating_then_reject(wired, family):
    vip, (a, b) = FAMILIES[family]["vip"], FAMILIES[family]["pods"]
    steps = [(READY, DRAINED), (NOT_READY, DRAINED), (NOT_READY, GONE)]
    models = [calc_step(family, s) for s in steps]
    wired.run(["nft", "-f", "-"], input=render_transaction(None, models[0]))
    seen = Counter(connect(wired, vip, 40).stdout.split())
    assert seen == {a: 40}, seen  # b, terminating, gets no new connection while a is ready
    wired.run(["nft", "-f", "-"], input=render_transaction(models[0], models[1]))
    seen = Counter(connect(wired, vip, 40).stdout.split())
    assert seen == {b: 40}, seen  # none ready: the serving terminating one answers
    wired.run(["nft", "-f", "-"], input=render_transaction(models[1], models[2]))
    refused = connect(wired, vip, 1, check=False)
    assert refused.returncode and "ConnectionRefusedError" in refused.stderr, refused.stderr
