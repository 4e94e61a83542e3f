"""The measuring tools of bench/svc_e2e.py: the client Pod's connect poller, the bulk writer
of synthetic Services (run inside a node: ``python -m bench.svc_e2e_load --write ENDPOINTS N
PER_SERVICE``) and pycnid's metrics scraped from inside a node namespace."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Callable

from services.record import EndpointRecord, ServicePort, ServiceRecord, service_ip_key
from tests.fixtures.daemon import parse_samples
from tests.fixtures.etcd import run_in_netns

METRICS = "127.0.0.1:9464"  # metricsAddress of each node's pycnid
SYNTHETIC_NODE = "synthetic"  # the node of every bulk endpoint: none of the cluster's
PER_TXN = 18  # Services a txn: 18 x (Service + VIP index + 5 endpoints) = 126 <= etcd's 128
POLLER = """
import select, socket, sys, time
for line in sys.stdin:
    ip, port = line.split(); pending, done, due = {}, None, time.monotonic()
    while done is None:
        now = time.monotonic()
        if now >= due:
            s = socket.socket(); s.setblocking(False); s.connect_ex((ip, int(port)))
            pending[s], due = now, now + 0.005
        for s in select.select([], list(pending), [], max(0.0, due - now))[1]:
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 and done is None:
                done = time.monotonic()
            del pending[s]; s.close()
        for s in [s for s, at in pending.items() if time.monotonic() - at > 1.0]:
            del pending[s]; s.close()
    for s in pending: s.close()
    print("ok", repr(done), flush=True)
"""


# --- the bulk writer (runs inside node1) ----------
def calc_bulk_addresses(i: int, endpoints: int) -> tuple[str, str, list[str]]:
    """Service ``i``'s namespace (100 a namespace), VIP and endpoint IPs (synthetic), the same
    whichever source the Service is written to (store records here, API objects in
    bench/svc_api.py)."""
    first = i * endpoints
    ips = [
        f"10.{200 + n // 65536}.{n // 256 % 256}.{n % 256}"
        for n in range(first, first + endpoints)
    ]
    return f"bulk{i // 100}", f"10.96.{(i + 1) // 256}.{(i + 1) % 256}", ips


def calc_bulk_service(i: int, endpoints: int) -> list[tuple[str, bytes]]:
    """Service ``i``, its VIP index key and its endpoints."""
    ns, vip, ips = calc_bulk_addresses(i, endpoints)
    record = ServiceRecord(
        ns,
        f"s{i}",
        ports=(ServicePort("", "TCP", 80, 8080),),
        cluster_ips=(vip,),
        selector={"app": f"s{i}"},
    )
    keys = [(record.key, record.to_bytes()), (service_ip_key(vip), record.ref.encode())]
    for e, ip in enumerate(ips):
        ep = EndpointRecord(ns, f"s{i}-{e}", "eth0", (ip,), {"app": f"s{i}"}, SYNTHETIC_NODE)
        keys.append((ep.key, ep.to_bytes()))
    return keys


def write_bulk(endpoints_csv: str, services: int, per_service: int) -> None:
    """Every bulk Service through the store's txn, PER_TXN a txn; prints the wall-clock
    (first, last) times: before the first txn, after the last one answered."""
    from store.base import Put
    from store.etcd import EtcdStore

    store = EtcdStore(endpoints_csv.split(","))
    first = time.time()
    for start in range(0, services, PER_TXN):
        ops = [
            Put(k, v)
            for i in range(start, min(services, start + PER_TXN))
            for k, v in calc_bulk_service(i, per_service)
        ]
        assert store.txn([], ops).succeeded
    print(json.dumps([first, time.time()]), flush=True)
    store.close()


# --- metrics -------------------------------------------------------------------------------
def scrape(ns: str) -> dict[str, float]:
    """pycnid's metrics on node namespace ``ns`` (fetched from a thread inside it)."""

    def fetch() -> str:
        with urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=5) as response:
            return response.read().decode()

    return parse_samples(run_in_netns(ns, fetch))


def wait_metric(
    ns: str, enough: Callable[[dict], bool], timeout: float
) -> tuple[float | None, dict]:
    """Until ``enough(samples)``: (monotonic stamp, samples), or (None, last samples)."""
    deadline = time.monotonic() + timeout
    samples: dict = {}
    while time.monotonic() < deadline:
        try:
            samples = scrape(ns)
        except OSError:  # pycnid restarting
            samples = {}
        if samples and enough(samples):
            return time.monotonic(), samples
        time.sleep(0.02)
    return None, samples


def services_metric(samples: dict) -> float:
    return samples.get('pycni_proxy_services{family="ipv4"}', 0.0)


if __name__ == "__main__":
    if sys.argv[1:2] != ["--write"]:
        sys.exit("usage: python -m bench.svc_e2e_load --write ENDPOINTS N PER_SERVICE")
    write_bulk(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
