"""Dual-stack pools across nodes: a pool of a second family added after the nodes started gets
each node a VTEP of that family, and Pods reach each other by their IPv6 addresses too (node
routes per IPv6 block through the IPv6 VTEPs, the bridge answering solicitations for remote
Pods' addresses), and `pycni doctor` finds all of it explained."""

from __future__ import annotations

import os

import pytest

from tests.fixtures.bridge import ip_of
from tests.fixtures.doctor import assert_doctor_clean
from tests.fixtures.waiting import wait_for

from .pods import NETWORK, OverlayCluster, pod_conf

pytestmark = pytest.mark.etcd


def test_dual_stack_pods_reach_each_other_over_ipv6_too(overlay_cluster):
    cluster: OverlayCluster = overlay_cluster("vxlan", nodes=2)
    cluster.add_pool("pods6", "fd31::/112", 122)
    records = cluster.wait_vteps(lambda overlay: len(overlay["vteps"]) == 2)
    conf = pod_conf()
    conf["ipam"] = {
        **conf["ipam"],
        "pools": ["pods", "pods6"],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
    }
    pods = [cluster.add_pod(node, conf) for node in cluster.nodes]
    six = [ip_of(p.result, 1) for p in pods]
    assert all(":" in ip for ip in six), records
    for node in cluster.nodes:  # proxied NDP answered at once, not after up to 0.8 s
        knob = node.host.ns.run("cat /proc/sys/net/ipv6/neigh/pycni0/proxy_delay").stdout
        assert knob.strip() == "0"
    wait_for("IPv6 across nodes", lambda: pods[0].ns.ping(six[1], timeout=1), 10, 0.2)
    wait_for("IPv6 back", lambda: pods[1].ns.ping(six[0], timeout=1), 10, 0.2)
    wait_for("IPv4 across nodes", lambda: pods[0].ns.ping(pods[1].ip, timeout=1), 10, 0.2)
    node = cluster.nodes[0]  # its IPv6 routes, neighbours and ND proxy entries are explained
    config = os.path.join(node.daemon.workdir, "pycnid.json")
    assert_doctor_clean(node.host.ns, config, networks=(NETWORK,))
