"""Endpoint conditions with real packets: endpoint records (as pycni-svc and `pycni svc
endpoint set|drain` write them) through the proxy's own path (``Records`` → ``calc_model`` →
the table's transactions, each step a diff on the last as pycnid applies them) into a real
nft, and real TCP connections from a host namespace to the ClusterIP, IPv4 and IPv6:

1. one ready endpoint and one drained (serving, terminating): every connection goes to the
   ready one — the terminating one gets no new connection while a ready one exists;
2. the ready one becomes not ready: the serving terminating one answers every connection;
3. that one stops serving too: no usable endpoint, the connection is rejected.

And UDP, whose conntrack entries the proxy cleans after each pass (``conntrack.py``, run in
the namespace as pycnid runs it): a client's flow to an endpoint that is drained stays on it
(it still serves) while new flows go to the ready one; once it stops serving, the flow's
entry is deleted and the same client socket moves to the ready one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

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
UDP_SERVER = """
import selectors, socket, sys
sel = selectors.DefaultSelector()
for ip in sys.argv[1:]:
    s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, 8080)); sel.register(s, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        s = key.fileobj
        _, peer = s.recvfrom(64); s.sendto(s.getsockname()[0].encode(), peer)
"""
UDP_CLIENT = """
import socket, sys
vip, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for port in range(first, first + count):
    with socket.socket(socket.AF_INET6 if ":" in vip else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.settimeout(5); s.bind(("", port)); s.connect((vip, 53)); s.send(b"?")
        print(s.recv(64).decode())
"""
CLEAN = """
import json, sys
from services.proxy import conntrack
from tests.netns.test_svc_conditions import calc_step
family, (before, after) = int(sys.argv[1]), json.loads(sys.argv[2])
checks = conntrack.calc_checks(
    conntrack.calc_udp_serving(calc_step(family, before)),
    conntrack.calc_udp_serving(calc_step(family, after)),
    False,
)
print(conntrack.clean_stale(checks, family))
"""
ROOT = Path(__file__).resolve().parents[2]
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
        "ns", "web", "ClusterIP",
        (ServicePort("http", "TCP", 80, 8080), ServicePort("dns", "UDP", 53, 8080)),
        (f["vip"],), (), {"app": "web"},
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
    every = [ip for f in FAMILIES.values() for ip in f["pods"]]
    servers = [
        subprocess.Popen(["ip", "netns", "exec", pods.name, sys.executable, "-c", SERVER]),
        subprocess.Popen(
            ["ip", "netns", "exec", pods.name, sys.executable, "-c", UDP_SERVER, *every]
        ),
    ]
    try:
        for ip in every:
            pods.run([sys.executable, "-c", WAIT, ip])
        yield host
    finally:
        for server in servers:
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


def udp(host, vip: str, first: int, count: int = 1) -> list[str]:
    return host.run([sys.executable, "-c", UDP_CLIENT, vip, str(first), str(count)]).stdout.split()


def ensure_step(host, family: int, before: tuple, after: tuple) -> int:
    """The pass from ``before`` to ``after``: its transaction, then its conntrack cleanup
    (in the namespace, as pycnid runs it); how many stale entries went."""
    m0, m1 = calc_step(family, before), calc_step(family, after)
    host.run(["nft", "-f", "-"], input=render_transaction(m0, m1))
    states = json.dumps([before, after])
    done = subprocess.run(
        ["ip", "netns", "exec", host.name, sys.executable, "-c", CLEAN, str(family), states],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(done.stdout)


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_a_drained_endpoint_keeps_its_udp_flows_until_it_stops_serving(wired, family):
    vip, pods = FAMILIES[family]["vip"], FAMILIES[family]["pods"]
    both = (READY, READY)
    wired.run(["nft", "-f", "-"], input=render_transaction(None, calc_step(family, both)))
    (kept,) = udp(wired, vip, 40001)  # the flow under test, on one of the two
    other = next(ip for ip in pods if ip != kept)
    drained = tuple(DRAINED if ip == kept else READY for ip in pods)
    assert ensure_step(wired, family, both, drained) == 0  # it still serves: nothing deleted
    assert udp(wired, vip, 40001) == [kept]
    assert set(udp(wired, vip, 40100, 20)) == {other}  # new flows: the ready one only
    gone = tuple(GONE if ip == kept else READY for ip in pods)
    assert ensure_step(wired, family, drained, gone) >= 1
    assert udp(wired, vip, 40001) == [other]
