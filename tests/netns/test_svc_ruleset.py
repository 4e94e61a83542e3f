"""The rendered Service ruleset in a real nft: a host client reaches a VIP through nat output,
spread over three backends; an empty Service is refused at once; the tracer names exactly
the backends conntrack shows the connections went to. UDP is DNATed too (its own backends
map), sticks under ClientIP affinity (and is balanced unstuck once the clients set is full),
and keeps working after an element-diff transaction;
SCTP sockets need the sctp module, which this kernel may not offer inside a netns."""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from services.proxy.elements import calc_elements
from services.proxy.model import ProxyModel, ProxyPort, ProxyService
from services.proxy.render import BACKENDS_MAPS, CLIENTS, TABLE
from services.proxy.table import render_transaction
from services.proxy.trace import explain
from tests.fixtures.echo import WHOAMI_SERVER
from tests.fixtures.svc_kernel import calc_stuck_clients
from tests.fixtures.svc_model import EMPTY, NODE, NODE6, WEB, be, view

pytestmark = pytest.mark.netns
BACKENDS = ("10.0.0.2", "10.0.0.3", "10.0.0.4")
SERVER = WHOAMI_SERVER
CLIENT = """
import socket, sys
for _ in range(int(sys.argv[3])):
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:
        print(s.recv(64).decode())
"""
UDP_SERVER = """
import selectors, socket, sys
sel = selectors.DefaultSelector()
for ip in sys.argv[2:]:
    s = socket.socket(socket.AF_INET, int(sys.argv[1]))
    s.bind((ip, 8080))
    if s.type == socket.SOCK_STREAM: s.listen()
    sel.register(s, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        s = key.fileobj
        if s.type == socket.SOCK_DGRAM:
            _, peer = s.recvfrom(64); s.sendto(s.getsockname()[0].encode(), peer)
        else:
            c, _ = s.accept(); c.sendall(c.getsockname()[0].encode()); c.close()
"""
DGRAM_CLIENT = """
import socket, sys
for _ in range(int(sys.argv[3])):
    with socket.socket(socket.AF_INET, int(sys.argv[4])) as s:
        s.settimeout(5); s.connect((sys.argv[1], int(sys.argv[2]))); s.send(b"?")
        print(s.recv(64).decode())
"""
UDP_READY = """
import socket, time
for _ in range(100):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(1); s.connect(("10.0.0.4", 8080)); s.send(b"?")
        try: s.recv(64); break
        except OSError: time.sleep(0.05)
"""
NFT_KEPT_CONTEXT = """
import sys
from kernel.nft import Nft
nft = Nft()
print(nft.engine)
for path in sys.argv[1:]:
    nft.run(open(path).read())
"""
SCTP_INIT_SENDER = """
import socket, struct, sys
def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8): crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_SCTP)
for sport in range(40000, 40000 + int(sys.argv[3])):
    init = struct.pack("!BBHIIHHI", 1, 0, 20, sport, 65535, 1, 1, sport)
    head = struct.pack("!HHII", sport, int(sys.argv[2]), 0, 0)
    packet = head + init
    s.sendto(packet[:8] + struct.pack("<I", crc32c(packet)) + packet[12:], (sys.argv[1], 0))
"""
SCTP_INIT_RECEIVER = """
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_SCTP)
s.settimeout(10); print("ready", flush=True)
for _ in range(int(sys.argv[1])):
    packet = s.recv(256)
    ihl = (packet[0] & 15) * 4
    print(socket.inet_ntoa(packet[16:20]), struct.unpack("!H", packet[ihl + 2:ihl + 4])[0])
"""
ROOT = Path(__file__).resolve().parents[2]


def svc(
    name: str, vip: str, proto: str, affinity: int | None = None, node_port: int | None = None
) -> ProxyService:
    port = ProxyPort("p", proto, 53, node_port)
    return ProxyService(
        "default", name, (ipaddress.ip_address(vip),), ports=(port,), affinity_timeout=affinity
    )


DNS, SCTP, STICKY_DNS, NO_DNS = (
    svc("dns", "10.96.0.20", "udp", node_port=30053),
    svc("sctp", "10.96.0.21", "sctp"),
    svc("sticky-dns", "10.96.0.22", "udp", 10800),
    svc("no-dns", "10.96.0.23", "udp"),
)
ALL = tuple(be(ip) for ip in BACKENDS)
MODEL = ProxyModel(
    4,
    NODE,
    (
        view(WEB, WEB.ports[0], *ALL),
        view(EMPTY, EMPTY.ports[0]),
        *(view(s, s.ports[0], *ALL) for s in (DNS, SCTP, STICKY_DNS)),
        view(NO_DNS, NO_DNS.ports[0]),
    ),
)


@pytest.fixture
def wired(netns_factory):
    """host (client, the table) --veth-- pods (three backend addresses, one TCP server)."""
    host, pods = netns_factory("svchost"), netns_factory("svcpods")
    host.run(["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", pods.name])
    host.run(
        "ip addr add 10.0.0.1/24 dev v0 && ip link set v0 up && ip route add 10.96.0.0/16 dev v0"
    )
    pods.run("ip link set v1 up" + "".join(f" && ip addr add {ip}/24 dev v1" for ip in BACKENDS))
    server = subprocess.Popen(["ip", "netns", "exec", pods.name, sys.executable, "-c", SERVER])
    udp = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            pods.name,
            sys.executable,
            "-c",
            UDP_SERVER,
            str(socket.SOCK_DGRAM),
            *BACKENDS,
        ]
    )
    try:
        host.run(["nft", "-f", "-"], input=render_transaction(None, MODEL))
        pods.run(
            [
                sys.executable,
                "-c",
                "import socket,time\nfor _ in range(100):\n try:\n"
                "  socket.create_connection(('10.0.0.2',8080),1).close(); break\n"
                " except OSError: time.sleep(0.05)",
            ]
        )
        pods.run([sys.executable, "-c", UDP_READY])
        yield host, pods
    finally:
        for proc in (server, udp):
            proc.kill()
            proc.wait()


def dgram(host, vip: str, count: int, kind: int = socket.SOCK_DGRAM, check: bool = True):
    return host.run(
        [sys.executable, "-c", DGRAM_CLIENT, vip, "53", str(count), str(kind)], check=check
    )


def test_vip_spreads_refuses_empty_and_matches_the_tracer(wired):
    wired, _pods = wired
    out = wired.run([sys.executable, "-c", CLIENT, "10.96.0.10", "80", "300"]).stdout.split()
    seen = Counter(out)
    assert set(seen) == set(BACKENDS) and all(n >= 60 for n in seen.values()), seen
    refused = wired.run([sys.executable, "-c", CLIENT, "10.96.0.13", "80", "1"], check=False)
    assert "ConnectionRefusedError" in refused.stderr
    answer = explain(
        MODEL,
        NODE,
        ipaddress.ip_address("10.0.0.1"),
        0,
        ipaddress.ip_address("10.96.0.10"),
        80,
        "tcp",
    )
    assert answer.verdict == "dnat" and not any(c.masquerade for c in answer.choices)
    tracked = wired.run(["conntrack", "-L", "-p", "tcp", "--orig-dst", "10.96.0.10"]).stdout
    reply_sources = {
        line.split("src=")[2].split()[0]
        for line in tracked.splitlines()
        if line.count("src=") == 2
    }
    assert reply_sources == {c.ip for c in answer.choices}
    assert all(
        "dst=10.0.0.1 " in line.split("src=")[2]
        for line in tracked.splitlines()
        if line.count("src=") == 2
    )  # client IP kept, as the tracer says
    empty = explain(
        MODEL,
        NODE,
        ipaddress.ip_address("10.0.0.1"),
        0,
        ipaddress.ip_address("10.96.0.13"),
        80,
        "tcp",
    )
    assert (empty.verdict, empty.reason) == ("reject", "no endpoints")


def test_udp_is_dnated_spread_and_refused_only_when_empty(wired):
    host, _pods = wired
    seen = Counter(dgram(host, "10.96.0.20", 150).stdout.split())
    assert set(seen) == set(BACKENDS) and all(n >= 25 for n in seen.values()), seen
    refused = dgram(host, "10.96.0.23", 1, check=False).stderr  # rejected in filter-output: EPERM
    assert "PermissionError" in refused or "ConnectionRefusedError" in refused, refused
    tcp = host.run([sys.executable, "-c", CLIENT, "10.96.0.10", "80", "3"]).stdout.split()
    assert set(tcp) <= set(BACKENDS) and len(tcp) == 3


def test_udp_affinity_sticks_to_one_backend(wired):
    host, _pods = wired
    seen = set(dgram(host, "10.96.0.22", 30).stdout.split())
    assert len(seen) == 1 and seen <= set(BACKENDS), seen
    assert calc_stuck_clients(host.run, 4).count("10.0.0.1") == 1  # under one endpoint's key


#: ``clients`` with room for one client, which a client of no Service takes (a re-added set
#: takes the size it is given)
ONE_CLIENT = f"""add set ip {TABLE} {CLIENTS} {{ typeof numgen random mod 1 . ip saddr;
    flags dynamic,timeout; size 1; }}
add element ip {TABLE} {CLIENTS} {{ 7 . 10.9.9.9 timeout 1h }}
"""


def test_a_client_past_the_clients_set_size_is_balanced_not_stuck(wired):
    """With ``clients`` full, an ``update`` cannot add the client and ends its rule: the
    affinity chain's last picks still DNAT each new flow, spread over the backends, and the
    set holds only what filled it."""
    host, _pods = wired
    host.run(["nft", "-f", "-"], input=ONE_CLIENT)
    seen = set(dgram(host, "10.96.0.22", 30).stdout.split())
    assert len(seen) > 1 and seen <= set(BACKENDS), seen
    assert calc_stuck_clients(host.run, 4) == ["10.9.9.9"]


def test_a_second_transaction_moves_udp_and_tcp_to_the_remaining_backends(wired):
    host, _pods = wired
    kept = ALL[:2]
    m1 = replace(
        MODEL, ports=tuple(replace(v, backends=kept) if v.backends else v for v in MODEL.ports)
    )
    host.run(["nft", "-f", "-"], input=render_transaction(MODEL, m1))
    udp = Counter(dgram(host, "10.96.0.20", 60).stdout.split())
    assert set(udp) == {str(b.ip) for b in kept}, udp
    tcp = Counter(
        host.run([sys.executable, "-c", CLIENT, "10.96.0.10", "80", "60"]).stdout.split()
    )
    assert set(tcp) == {str(b.ip) for b in kept}, tcp


def test_sctp_is_dnated(wired):
    host, pods = wired
    probe = [
        sys.executable,
        "-c",
        "import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP)",
    ]
    if pods.run(probe, check=False).returncode or host.run(probe, check=False).returncode:
        pytest.skip("SCTP sockets unavailable in a netns here (no sctp kernel module)")
    kind = f"{socket.SOCK_STREAM}, {socket.IPPROTO_SCTP}"
    server = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            pods.name,
            sys.executable,
            "-c",
            UDP_SERVER.replace("int(sys.argv[1])", kind),
            "0",
            *BACKENDS,
        ]
    )
    try:
        client = CLIENT.replace(
            "socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)",
            f"socket.socket(socket.AF_INET, {kind})",
        )
        client = client.replace(" as s:\n", " as s:\n        s.connect((sys.argv[1], 53))\n")
        seen = set(
            host.run([sys.executable, "-c", client, "10.96.0.21", "53", "30"]).stdout.split()
        )
        assert seen == set(BACKENDS)
    finally:
        server.kill()
        server.wait()


def model6() -> ProxyModel:
    """Every protocol, plain and ClientIP, in IPv6: the kept-context test's second family."""
    ports = [ProxyPort(p, p, 53, 30053 + i) for i, p in enumerate(("tcp", "udp", "sctp"))]
    plain = ProxyService("default", "v6", (ipaddress.ip_address("fd96::20"),), ports=tuple(ports))
    sticky = replace(
        plain,
        name="v6-sticky",
        vips=(ipaddress.ip_address("fd96::21"),),
        ports=tuple(replace(p, node_port=None) for p in ports),
        affinity_timeout=60,
    )
    ends = (be("fd00::2", 53), be("fd00::3", 53), be("fd00::4", 53))
    return ProxyModel(6, NODE6, tuple(view(s, p, *ends) for s in (plain, sticky) for p in s.ports))


@pytest.mark.parametrize("m0", [MODEL, model6()], ids=["ipv4", "ipv6"])
def test_one_kept_libnftables_context_applies_later_element_diffs(netns_factory, tmp_path, m0):
    """Where ``th dport`` data broke: a later transaction reading the typed maps back."""
    ns = netns_factory("svckept")
    m1 = replace(m0, ports=tuple(replace(v, backends=v.backends[1:]) for v in m0.ports))
    scripts = [
        render_transaction(None, m0),
        render_transaction(m0, m1),
        render_transaction(m1, m0),
    ]
    paths = []
    for i, text in enumerate(scripts):
        paths.append(tmp_path / f"t{i}.nft")
        paths[-1].write_text(text)
    ns.run([sys.executable, "-c", NFT_KEPT_CONTEXT, *map(str, paths)], cwd=ROOT)
    family = "ip" if m0.family == 4 else "ip6"
    expected = Counter(e.name for e in calc_elements(m0) if "backends-" in e.name)
    assert {"backends-udp", "backends-sctp", "np-backends-udp"} <= set(expected)
    for name in BACKENDS_MAPS:
        listed = json.loads(ns.run(["nft", "-j", "list", "map", family, "pycni-svc", name]).stdout)
        elem = [o["map"] for o in listed["nftables"] if "map" in o][0].get("elem", [])
        assert len(elem) == expected[name], name


def test_sctp_inits_are_dnated_without_an_sctp_stack(wired):
    """Raw SCTP INIT packets (no sctp module needed): nat output rewrites them to a backend."""
    host, pods = wired
    receiver = subprocess.Popen(
        ["ip", "netns", "exec", pods.name, sys.executable, "-c", SCTP_INIT_RECEIVER, "60"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.stdout.readline().strip() == "ready"
        host.run([sys.executable, "-c", SCTP_INIT_SENDER, "10.96.0.21", "53", "60"])
        out, _ = receiver.communicate(timeout=30)
    finally:
        receiver.kill()
        receiver.wait()
        receiver.stdout.close()  # also when the readline failed: no pipe left to the collector
    seen = Counter(tuple(line.split()) for line in out.splitlines())
    assert set(seen) == {(ip, "8080") for ip in BACKENDS} and sum(seen.values()) == 60, seen
