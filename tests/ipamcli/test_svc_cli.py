"""`pycni svc` on SQLite and on a real etcd: settings, create with allocation and with explicit
VIPs and nodePorts, refusals that name the field and write nothing (the whole store compared),
set keeping allocations, rm freeing them, concurrent creates in separate processes never
sharing a VIP, and endpoints picked by selector from records written through the codec."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from services.record import EndpointRecord
from store.base import Put

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def configured(svc):
    svc(
        "config",
        "set",
        "--cidr",
        "10.96.0.0/28",
        "--cidr",
        "fd00:96::/124",
        "--node-port-range",
        "30000-30009",
    )
    return svc


def snapshot(store) -> dict:
    return {kv.key: kv.value for kv in store.range("/")}


def test_settings_show_what_was_set(svc):
    assert svc("config", "show") == {"settings": None}
    svc("config", "set", "--cidr", "10.96.0.0/16")
    assert svc("config", "show")["settings"] == {
        "cidrs": ["10.96.0.0/16"],
        "nodePortRange": "30000-32767",
    }


def test_create_allocates_and_explicit_values_are_kept(configured, store):
    web = configured("create", "default/web", "--port", "http:80:8080", "--selector", "app=web")[
        "service"
    ]
    assert web["clusterIPs"] == ["10.96.0.1", "fd00:96::1"] and "nodePort" not in web["ports"][0]
    np = configured(
        "create",
        "default/np",
        "--type",
        "NodePort",
        "--port",
        "http:80/TCP:http",
        "--port",
        "dns:53/UDP::30005",
        "--cluster-ip",
        "10.96.0.9",
    )["service"]
    assert np["clusterIPs"] == ["10.96.0.9"]
    assert [p["nodePort"] for p in np["ports"]] == [30000, 30005]
    assert store.get("/pycni/v1/serviceips/10.96.0.9").value == b"default/np"
    assert store.get("/pycni/v1/nodeports/UDP/30005").value == b"default/np"
    assert [s["name"] for s in configured("ls")["services"]] == ["np", "web"]
    assert configured("show", "default/web")["service"] == web


REFUSALS = [
    (["default/x", "--port", "70000"], "ports[0].port"),
    (["default/x", "--port", "a:80", "--port", "a:81"], "ports[1].name"),
    (["default/x", "--port", "80::30001"], "ports[0].nodePort: only a NodePort"),
    (["default/x", "--type", "NodePort", "--port", "80::31000"], "ports[0].nodePort"),
    (["default/x", "--port", "80", "--cluster-ip", "10.97.0.1"], "clusterIPs[0]"),
    (["default/x", "--port", "80", "--external-ip", "10.96.0.3"], "externalIPs[0]"),
    (["default/x", "--port", "80", "--cluster-ip", "10.96.0.1"], "held by Service default/web"),
    (["default/x", "--type", "NodePort", "--port", "80::30000"], "nodePort TCP/30000 is held"),
    (["default/web", "--port", "80"], "Service default/web exists"),
    (["default/x", "--port", "80", "--affinity-timeout", "5"], "timeoutSeconds"),
    (["default/x", "--port", "80", "--external-traffic-policy", "Local"], "externalTrafficPolicy"),
    (["default/x", "--port", "80:8080:abc"], "--port"),
    (["nonsense", "--port", "80"], "NAMESPACE/NAME"),
    (["default/x", "--port", "80", "--load-balancer-ip", "1.2.3.4"], "loadBalancerIPs: only a"),
    (
        ["default/x", "--type", "LoadBalancer", "--port", "80", "--load-balancer-ip", "::1"],
        "loadBalancerIPs[0]",
    ),
    (
        ["default/x", "--type", "LoadBalancer", "--port", "80"]
        + ["--load-balancer-source-range", "10.0.0.1/8"],
        "loadBalancerSourceRanges[0]",
    ),
]


@pytest.mark.parametrize("args,named", REFUSALS)
def test_bad_input_is_refused_naming_it_and_nothing_is_written(configured, store, args, named):
    configured("create", "default/web", "--type", "NodePort", "--port", "80")
    before = snapshot(store)
    assert named in configured("create", *args, code=1)
    assert snapshot(store) == before


def test_an_unknown_field_in_json_is_refused(configured, store, tmp_path):
    path = tmp_path / "svc.json"
    path.write_text(json.dumps({"ports": [{"port": 80, "nodeport": 30001}]}))
    before = snapshot(store)
    assert "ports[0].nodeport: unknown field" in configured(
        "create", "default/x", "--from-json", str(path), code=1
    )
    assert snapshot(store) == before


def test_set_keeps_allocations_and_re_indexes_what_changes(configured, store):
    first = configured(
        "create", "default/np", "--type", "NodePort", "--port", "http:80", "--port", "dns:53/UDP"
    )["service"]
    changed = configured(
        "set",
        "default/np",
        "--port",
        "http:80:8080",
        "--port",
        "dns:53/UDP::30009",
        "--session-affinity",
        "ClientIP",
    )["service"]
    assert changed["clusterIPs"] == first["clusterIPs"]
    assert [p["nodePort"] for p in changed["ports"]] == [first["ports"][0]["nodePort"], 30009]
    assert changed["ports"][0]["targetPort"] == 8080 and changed["timeoutSeconds"] == 10800
    assert store.get(f"/pycni/v1/nodeports/UDP/{first['ports'][1]['nodePort']}") is None
    assert store.get("/pycni/v1/nodeports/UDP/30009").value == b"default/np"
    assert (
        configured("set", "default/np", "--type", "ClusterIP")["service"]["ports"][0].get(
            "nodePort"
        )
        is None
    )
    assert store.range("/pycni/v1/nodeports/") == []


def test_rm_frees_what_the_service_held(configured, store):
    configured("create", "default/np", "--type", "NodePort", "--port", "80")
    assert configured("rm", "default/np") == {
        "removed": "default/np",
        "freed": {"clusterIPs": ["10.96.0.1", "fd00:96::1"], "nodePorts": ["TCP/30000"]},
    }
    assert store.range("/pycni/v1/") == store.range("/pycni/v1/meta/")
    again = configured("create", "default/np2", "--type", "NodePort", "--port", "80")
    assert again["service"]["clusterIPs"][0] == "10.96.0.1"
    assert "no Service default/np" in configured("rm", "default/np", code=1)


def test_concurrent_creates_never_share_a_vip(configured, store_args):
    env = {**os.environ, "PYTHONPATH": ROOT}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli",
                "svc",
                "create",
                f"ns/s{i}",
                "--type",
                "NodePort",
                "--port",
                "80",
                *store_args,
                "-o",
                "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for i in range(8)
    ]
    docs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        docs.append(json.loads(out)["service"])
    vips = [ip for d in docs for ip in d["clusterIPs"]]
    ports = [d["ports"][0]["nodePort"] for d in docs]
    assert len(set(vips)) == len(vips) == 16 and len(set(ports)) == 8


def test_endpoints_are_the_pods_the_selector_matches(configured, store):
    configured(
        "create",
        "default/web",
        "--port",
        "http:80:http",
        "--port",
        "raw:81:9000",
        "--selector",
        "app=web",
    )
    pods = [
        EndpointRecord(
            "default", "p1", "eth0", ("10.22.0.5",), {"app": "web"}, "node1", {"http": 8080}, "c1"
        ),
        EndpointRecord(
            "default", "p2", "eth0", ("10.22.0.6",), {"app": "web", "x": "y"}, "node2", {}, "c2"
        ),
        EndpointRecord("default", "p3", "eth0", ("10.22.0.7",), {"app": "db"}, "node1"),
        EndpointRecord("other", "p4", "eth0", ("10.22.0.8",), {"app": "web"}, "node1"),
    ]
    store.txn([], [Put(e.key, e.to_bytes()) for e in pods])
    doc = configured("endpoints", "default/web")
    assert [(e["pod"], e["ports"]) for e in doc["endpoints"]] == [
        ("p1", {"http": 8080, "raw": 9000}),
        ("p2", {"raw": 9000}),
    ]
    assert configured("show", "default/web")["endpointCount"] == 2


def test_a_load_balancer_is_created_and_set_through_the_flags(configured, store):
    made = configured(
        "create",
        "default/lb",
        "--type",
        "LoadBalancer",
        "--port",
        "80:8080",
        "--load-balancer-ip",
        "198.51.100.10",
        "--load-balancer-source-range",
        "203.0.113.0/24",
    )["service"]
    assert made["ports"][0]["nodePort"] == 30000  # a LoadBalancer has nodePorts
    assert made["loadBalancerIPs"] == ["198.51.100.10"]
    assert made["loadBalancerSourceRanges"] == ["203.0.113.0/24"]
    assert store.get("/pycni/v1/nodeports/TCP/30000").value == b"default/lb"
    changed = configured(
        "set",
        "default/lb",
        "--load-balancer-ip",
        "198.51.100.11",
        "--load-balancer-ip",
        "2001:db8::11",
    )["service"]
    assert changed["loadBalancerIPs"] == ["198.51.100.11", "2001:db8::11"]
    assert changed["loadBalancerSourceRanges"] == ["203.0.113.0/24"]  # not named: kept
    assert changed["ports"] == made["ports"]
