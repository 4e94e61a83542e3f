"""The synthetic Services of `make bench-svc-e2e` are what the bench says: unique VIPs in the
service CIDR clear of the create runs' VIPs, unique endpoint IPs clear of the update's new IP,
each Service's selector picking exactly its own endpoints, and every txn within etcd's limit.
The metrics parser reads back what a registry prints."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from bench import svc_e2e
from bench import svc_e2e_load as load
from services.record import EndpointRecord, ServiceRecord
from services.selectors import calc_endpoints
from store.keys import ENDPOINTS, SERVICE_IPS, SERVICES

CIDR = ipaddress.ip_network(svc_e2e.CIDR)
CREATE_VIPS = ipaddress.ip_network("10.96.255.0/24")


def decode_all(i: int, per: int) -> tuple[ServiceRecord, list[EndpointRecord], list[str]]:
    keys = load.calc_bulk_service(i, per)
    service = ServiceRecord.from_bytes(*keys[0])
    assert keys[1] == (f"{SERVICE_IPS}{service.cluster_ips[0]}", service.ref.encode())
    return service, [EndpointRecord.from_bytes(k, v) for k, v in keys[2:]], [k for k, _ in keys]


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=9999), st.integers(min_value=1, max_value=5))
def test_a_bulk_service_selects_exactly_its_own_endpoints(i, per):
    service, endpoints, keys = decode_all(i, per)
    neighbour, others, _ = decode_all(i + 1, per)
    assert keys[0].startswith(SERVICES) and all(k.startswith(ENDPOINTS) for k in keys[2:])
    picked = calc_endpoints(service, endpoints + others)
    assert [e for e, ports in picked] == endpoints and all(p == {"80": 8080} for _, p in picked)
    vip = ipaddress.ip_address(service.cluster_ips[0])
    assert vip in CIDR and vip not in CREATE_VIPS and vip != CIDR.network_address
    assert service.cluster_ips != neighbour.cluster_ips


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=1, max_value=10000).map(lambda n: range(max(0, n - 40), n)))
def test_bulk_addresses_never_repeat_and_txns_fit_etcd(indexes):
    made = [decode_all(i, 5) for i in indexes]
    vips = [s.cluster_ips[0] for s, _, _ in made]
    ips = [ip for _, eps, _ in made for e in eps for ip in e.ips]
    assert len(set(vips)) == len(vips) and len(set(ips)) == len(ips) == 5 * len(vips)
    assert "10.199.0.1" not in ips  # the update's new address is no one's yet
    assert load.PER_TXN * (2 + 5) <= 128


names = st.from_regex(r"[a-z_]{1,12}(\{family=\"ipv[46]\"\})?", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(names, st.floats(allow_nan=False, allow_infinity=False, width=32)))
def test_the_metrics_parser_reads_back_what_was_printed(samples):
    text = "".join(f"# HELP {name} x\n{name} {value!r}\n\n" for name, value in samples.items())
    assert load.parse_samples(text) == samples
