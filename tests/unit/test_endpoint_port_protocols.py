"""An endpoint record keeps each named port's protocol (``portProtocols``, only the ones that
are not TCP): records from before the field read as TCP and keep their bytes, an older reader
keeps the field as an unknown one, and a bad value is a corrupt record."""

from __future__ import annotations

import json

import pytest

from services.record import EndpointRecord
from store.codec import CorruptRecord, encode

KEY = "/pycni/v1/endpoints/default/web/eth0"
OLD = {
    "namespace": "default",
    "pod": "web",
    "ifname": "eth0",
    "ips": ["10.22.0.5"],
    "labels": {"app": "web"},
    "node": "n1",
    "ports": {"http": 8080, "dns": 53},
    "containerID": "c1",
    "network": "pycni",
    "ready": True,
    "serving": True,
    "terminating": False,
}


def test_a_record_from_before_the_field_reads_as_tcp_and_keeps_its_bytes():
    record = EndpointRecord.from_bytes(KEY, encode(OLD))
    assert record.protocol_of("http") == "TCP" and record.protocol_of("dns") == "TCP"
    assert record.to_bytes() == encode(OLD)


def test_protocols_round_trip_and_tcp_is_left_out():
    record = EndpointRecord.from_bytes(
        KEY, encode({**OLD, "portProtocols": {"dns": "UDP", "http": "TCP"}})
    )
    assert record.protocol_of("dns") == "UDP" and record.protocol_of("http") == "TCP"
    assert json.loads(record.to_bytes())["portProtocols"] == {"dns": "UDP"}
    assert EndpointRecord.from_bytes(KEY, record.to_bytes()) == record


def test_an_unknown_field_next_to_it_is_kept():
    record = EndpointRecord.from_bytes(
        KEY, encode({**OLD, "portProtocols": {"dns": "UDP"}, "future": 1})
    )
    assert json.loads(record.to_bytes())["future"] == 1


def test_a_bad_value_is_a_corrupt_record_naming_the_key():
    with pytest.raises(CorruptRecord, match=KEY):
        EndpointRecord.from_bytes(KEY, encode({**OLD, "portProtocols": ["UDP"]}))
