"""Review findings that need a real kernel (see tests/unit/test_svc_review.py): a Service that
`pycni svc create` accepts, rendered by the proxy's own pass into a namespace's nft."""
from __future__ import annotations

import subprocess
import sys

import pytest

from cni.proxy.sync import calc_plan
from ipam.ops.services import create, set_settings
from ipam.ops.svc_trace import read_records
from ipam.store.sqlite import SqliteStore

pytestmark = pytest.mark.netns
LISTENER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 80)); s.listen(); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"node's own"); c.close()
"""
CLIENT = """
import socket
try:
    with socket.create_connection(("127.0.0.1", 80), timeout=5) as s:
        print(s.recv(64).decode())
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.mark.xfail(strict=True, reason="validate_external_ips accepts 127.0.0.1 and the "
                   "proxy's nat-output/filter-output then hold it: with no endpoints the "
                   "node's own 127.0.0.1:80 is refused (with endpoints it is DNATed to them)")
def test_a_loopback_external_ip_leaves_the_nodes_localhost_alone(tmp_path, netns_factory):
    store = SqliteStore(str(tmp_path / "store.db"))
    try:
        set_settings(store, ["10.96.0.0/24"], "30000-32767")
        create(store, {"namespace": "ns", "name": "x", "ports": [{"port": 80}],
                       "externalIPs": ["127.0.0.1"]})
        records = read_records(store)
    finally:
        store.close()
    plan = calc_plan(records, "n1", 4, [], None, records.take_dirty())
    node = netns_factory("svcreview")
    node.run(["nft", "-f", "-"], input=plan.script)
    server = subprocess.Popen(["ip", "netns", "exec", node.name, sys.executable, "-c",
                               LISTENER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        answer = node.run([sys.executable, "-c", CLIENT]).stdout.strip()
    finally:
        server.kill()
        server.wait()
    assert answer == "node's own"
