"""A 2-node namespace cluster for sampled real packets against the reference model, dual-stack,
addressed as tests/fuzz/svc_cases.py's PLANS (IPv4 shown):

    outside (172.16.0.1-6, 192.168.1.9) --- a = n1 (192.168.1.2; 192.168.0.2; gateway 10.0.1.1)
                                                 |    +--- a Pod netns each: 10.0.1.2-5, 10.0.1.7
                                            b = n2 (192.168.0.3; gateway 10.0.2.1)
                                                      +--- a Pod netns each: 10.0.2.2-5, 10.0.2.7

Each Pod has its own netns (a /32 on eth0, the gateway on-link; IPv6 via fe80::1), as a Pod has,
so a reply never short-cuts the node that translated its request.

n1's Service table is programmed by the proxy's own pass (``calc_plan`` over the store's
records and the addresses ``read_local_addresses`` reads inside n1, under the case's proxy
settings, as pycnid does) for each case; every packet of a case is sent towards n1 (n2 has no
table: it routes to n1). Each pod namespace runs one dual-stack TCP server on 8080 answering
``<address reached>,<peer>``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures.echo import PEER_SERVER as SERVER
from tests.fixtures.netns import Netns, new_netns

ROOT = Path(__file__).resolve().parents[2]
PASS = """
import json, subprocess, sys
from services.ops.trace import read_records
from services.proxy.config import parse_proxy_config
from services.proxy.inputs import read_local_addresses
from services.proxy.sync import calc_plan
from store.sqlite import SqliteStore
config = parse_proxy_config({"services": json.loads(sys.argv[2])})
drop = "".join(f"add table {f} pycni-svc\\ndelete table {f} pycni-svc\\n" for f in ("ip", "ip6"))
subprocess.run(["nft", "-f", "-"], input=drop, text=True, check=True)
subprocess.run(["conntrack", "-F"], capture_output=True)
records = read_records(SqliteStore(sys.argv[1]))
for family in (4, 6):
    local = list(read_local_addresses())
    plan = calc_plan(records, "n1", family, local, None, set(), (), {}, config)
    if plan is not None:
        subprocess.run(["nft", "-f", "-"], input=plan.script, text=True, check=True)
"""
CONNECT = """
import socket, sys
src, dst, port, count, timeout = sys.argv[1:]
family = socket.AF_INET6 if ":" in dst else socket.AF_INET
for _ in range(int(count)):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(float(timeout))
    try:
        s.bind((src, 0)); s.connect((dst, int(port))); print(s.recv(128).decode() or "empty")
    except OSError as exc:
        print(type(exc).__name__)
    finally:
        s.close()
"""
NODES = {  # node netns: its Pod prefixes and gateways
    "a": ("10.0.1.", "fd00:0:1::"),
    "b": ("10.0.2.", "fd00:0:2::"),
}
HOSTS = (2, 3, 4, 5, 7)  # 2-5 serve (endpoints), 7 is a client only
SETUP = {
    "outside": [
        "ip link add o0 type veth peer name a1 netns {a}",
        "ip link set lo up && ip link set o0 up && ip addr add 192.168.1.9/24 dev o0",
        "ip addr add fd01:1::9/64 dev o0 nodad",
        *(
            f"ip addr add 172.16.0.{i}/32 dev o0 && ip addr add 2001:db8:9::{i}/128 dev o0 nodad"
            for i in range(1, 7)
        ),
        "ip route add default via 192.168.1.2 && ip -6 route add default via fd01:1::2",
    ],
    "a": [
        "ip link add a0 type veth peer name b0 netns {b}",
        "ip link set lo up && ip link set a1 up && ip link set a0 up",
        "ip addr add 192.168.1.2/24 dev a1 && ip addr add fd01:1::2/64 dev a1 nodad",
        "ip addr add 192.168.0.2/24 dev a0 && ip addr add fd01::2/64 dev a0 nodad",
        "ip route add 10.0.2.0/24 via 192.168.0.3 && ip -6 route add fd00:0:2::/64 via fd01::3",
        "ip route add default via 192.168.1.9",  # the service CIDRs too (README: the node
        "ip -6 route add default via fd01:1::9",  # must route them for a refusal to be sent)
    ],
    "b": [
        "ip link set lo up && ip link set b0 up",
        "ip addr add 192.168.0.3/24 dev b0 && ip addr add fd01::3/64 dev b0 nodad",
        "ip route add default via 192.168.0.2 && ip -6 route add default via fd01::2",
    ],
}


@dataclass
class SvcCluster:
    ns: dict[str, Netns]
    servers: list[subprocess.Popen]

    def program(self, db: Path, section: dict | None = None) -> None:
        """n1's table: one proxy pass over the store at ``db`` under the ``services`` config
        ``section`` (the last case's table removed)."""
        config = json.dumps(section or {"proxy": True})
        self.ns["a"].run([sys.executable, "-c", PASS, str(db), config], cwd=ROOT)

    def connect(self, where: str, src: str, dst: str, port: int, count: int) -> list[str]:
        out = self.ns[where].run(
            [sys.executable, "-c", CONNECT, src, dst, str(port), str(count), "1"], cwd=ROOT
        )
        return out.stdout.split()

    def conntrack(self, family: int, dst: str, port: int) -> list[str]:
        """The reply sources n1's conntrack holds for connections to ``dst``:``port``."""
        out = self.ns["a"].run(
            ["conntrack", "-L", "-f", f"ipv{family}", "-p", "tcp"]
            + ["-d", dst, "--dport", str(port)],
            check=False,
        )
        lines = [line for line in out.stdout.splitlines() if line.count("src=") == 2]
        return [line.split("src=")[2].split()[0] for line in lines]


def setup_pod(node: Netns, pod: Netns, prefix: str, prefix6: str, host: int) -> None:
    """One Pod: its address on eth0, the node's end routed to it, the gateway on-link."""
    node.run(
        f"ip link add p{host} type veth peer name eth0 netns {pod.name} && "
        f"ip link set p{host} up && ip addr add fe80::1/64 dev p{host} nodad && "
        f"ip route add {prefix}{host}/32 dev p{host} && "
        f"ip -6 route add {prefix6}{host}/128 dev p{host}"
    )
    pod.run(
        f"ip link set lo up && ip link set eth0 up && ip addr add {prefix}{host}/32 dev eth0 && "
        f"ip addr add {prefix6}{host}/128 dev eth0 nodad && "
        f"ip route add {prefix}1 dev eth0 && ip route add default via {prefix}1 && "
        "ip -6 route add default via fe80::1 dev eth0"
    )


def setup_svc_cluster() -> SvcCluster:
    ns: dict[str, Netns] = {}
    try:
        for name in ("outside", "a", "b"):
            ns[name] = new_netns(f"ref{name}")
        names = {k: v.name for k, v in ns.items()}
        for name, commands in SETUP.items():
            ns[name].run(" && ".join(commands).format(**names))
        servers = []
        for node, (prefix, prefix6) in NODES.items():
            ns[node].run(
                f"ip addr add {prefix}1/32 dev lo && ip addr add {prefix6}1/128 dev lo && "
                "sysctl -qw net.ipv4.ip_forward=1 && sysctl -qw net.ipv6.conf.all.forwarding=1"
            )
            for host in HOSTS:
                pod = ns[f"{prefix}{host}"] = new_netns(f"ref{node}{host}")
                setup_pod(ns[node], pod, prefix, prefix6, host)
                pod_ns = ["ip", "netns", "exec", pod.name, sys.executable, "-c", SERVER]
                servers.append(subprocess.Popen(pod_ns))
        warm_neighbours(ns["outside"])
        return SvcCluster(ns, servers)
    except BaseException:
        for n in ns.values():
            n.delete()
        raise


def warm_neighbours(outside: Netns) -> None:
    """One ping from outside to every Pod, both families: every link's neighbour entries
    resolved before a case's 1 s connect (an IPv6 first packet waits for neighbour discovery,
    and a case's connect must not time out on it)."""
    pods = [f"{p}{h}" for prefix in NODES.values() for p in prefix for h in HOSTS]
    pings = " & ".join(f"ping -c1 -W2 -q {ip} >/dev/null" for ip in pods)
    outside.run(f"{pings}; wait", check=False)


def teardown_svc_cluster(cluster: SvcCluster) -> None:
    for server in cluster.servers:
        server.kill()
        server.wait()
    for n in cluster.ns.values():
        n.delete()


def svc_cluster() -> Iterator[SvcCluster]:
    cluster = setup_svc_cluster()
    try:
        yield cluster
    finally:
        teardown_svc_cluster(cluster)
