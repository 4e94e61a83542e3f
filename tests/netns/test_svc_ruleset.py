"""The rendered Service ruleset in a real nft: a host client reaches a VIP through nat output,
spread over three backends; an empty Service is refused at once; the tracer names exactly
the backends conntrack shows the connections went to."""
from __future__ import annotations

import ipaddress
import subprocess
import sys
from collections import Counter

import pytest

from cni.proxy.elements import render_transaction
from cni.proxy.model import ProxyModel
from cni.proxy.trace import explain
from tests.fixtures.svc_model import EMPTY, NODE, WEB, be, view
from tests.fixtures.echo import WHOAMI_SERVER

pytestmark = pytest.mark.netns
BACKENDS = ("10.0.0.2", "10.0.0.3", "10.0.0.4")
SERVER = WHOAMI_SERVER
CLIENT = """
import socket, sys
for _ in range(int(sys.argv[3])):
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:
        print(s.recv(64).decode())
"""
MODEL = ProxyModel(4, NODE, (view(WEB, WEB.ports[0], *(be(ip) for ip in BACKENDS)),
                             view(EMPTY, EMPTY.ports[0])))


@pytest.fixture
def wired(netns_factory):
    """host (client, the table) --veth-- pods (three backend addresses, one TCP server)."""
    host, pods = netns_factory("svchost"), netns_factory("svcpods")
    host.run(["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1",
              "netns", pods.name])
    host.run("ip addr add 10.0.0.1/24 dev v0 && ip link set v0 up && "
             "ip route add 10.96.0.0/16 dev v0")
    pods.run("ip link set v1 up" + "".join(f" && ip addr add {ip}/24 dev v1" for ip in BACKENDS))
    server = subprocess.Popen(["ip", "netns", "exec", pods.name, sys.executable, "-c", SERVER])
    host.run(["nft", "-f", "-"], input=render_transaction(None, MODEL))
    pods.run([sys.executable, "-c", "import socket,time\nfor _ in range(100):\n try:\n"
              "  socket.create_connection(('10.0.0.2',8080),1).close(); break\n"
              " except OSError: time.sleep(0.05)"])
    yield host
    server.kill()
    server.wait()


def test_vip_spreads_refuses_empty_and_matches_the_tracer(wired):
    out = wired.run([sys.executable, "-c", CLIENT, "10.96.0.10", "80", "300"]).stdout.split()
    seen = Counter(out)
    assert set(seen) == set(BACKENDS) and all(n >= 60 for n in seen.values()), seen
    refused = wired.run([sys.executable, "-c", CLIENT, "10.96.0.13", "80", "1"], check=False)
    assert "ConnectionRefusedError" in refused.stderr
    answer = explain(MODEL, NODE, ipaddress.ip_address("10.0.0.1"), 0,
                     ipaddress.ip_address("10.96.0.10"), 80, "tcp")
    assert answer.verdict == "dnat" and not any(c.masquerade for c in answer.choices)
    tracked = wired.run(["conntrack", "-L", "-p", "tcp", "--orig-dst", "10.96.0.10"]).stdout
    reply_sources = {line.split("src=")[2].split()[0] for line in tracked.splitlines()
                     if line.count("src=") == 2}
    assert reply_sources == {c.ip for c in answer.choices}
    assert all("dst=10.0.0.1 " in line.split("src=")[2] for line in tracked.splitlines()
               if line.count("src=") == 2)  # client IP kept, as the tracer says
    empty = explain(MODEL, NODE, ipaddress.ip_address("10.0.0.1"), 0,
                    ipaddress.ip_address("10.96.0.13"), 80, "tcp")
    assert (empty.verdict, empty.reason) == ("reject", "no endpoints")
