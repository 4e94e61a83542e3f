"""The Service and endpoint records as the proxy holds them (services/record.py), under
generated input: decoded with their repeated strings interned and empty mappings and equal
labels shared, a record still reads back as written (byte for byte, unknown fields included),
equal records compare equal, any stored value reads as a record or CorruptRecord, what repeats
between records is held once, and shared labels are read-only and let go with their records."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.record import _LABELS, EMPTY, EndpointRecord, ServicePort, ServiceRecord
from tests.fixtures.records import assert_reads_or_corrupt

NAMES = st.text("abcdefgh0123456789-", min_size=1, max_size=10)
LABELS = st.dictionaries(NAMES, NAMES, max_size=3)
SCALARS = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=6)
UNKNOWN = st.dictionaries(
    st.text("xyz", min_size=1, max_size=4),
    SCALARS | st.lists(SCALARS, max_size=3) | st.dictionaries(NAMES, SCALARS, max_size=2),
    max_size=3,
)
ADDRESSES = st.integers(1, 250).map(lambda n: f"10.0.0.{n}") | st.integers(1, 250).map(
    lambda n: f"fd00::{n:x}"
)
SETTINGS = settings(max_examples=300, deadline=None, database=None)

PORTS = st.builds(
    ServicePort,
    st.sampled_from(["", "http", "dns"]),
    st.sampled_from(["TCP", "UDP", "SCTP"]),
    st.integers(1, 65535),
    st.integers(1, 65535) | NAMES,
    st.integers(0, 32767),
    UNKNOWN.map(lambda d: d or EMPTY),
)
SERVICES = st.builds(
    ServiceRecord,
    NAMES,
    NAMES,
    st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]),
    st.lists(PORTS, max_size=3).map(tuple),
    st.lists(ADDRESSES, max_size=2).map(tuple),
    st.lists(ADDRESSES, max_size=2).map(tuple),
    LABELS,
    st.sampled_from(["None", "ClientIP"]),
    st.integers(1, 86400),
    st.sampled_from(["Cluster", "Local"]),
    st.sampled_from(["Cluster", "Local"]),
    UNKNOWN.map(lambda d: d or EMPTY),
)
ENDPOINTS = st.builds(
    EndpointRecord,
    NAMES,
    NAMES,
    st.sampled_from(["eth0", "net1"]),
    st.lists(ADDRESSES, max_size=2).map(tuple),
    LABELS,
    NAMES,
    st.dictionaries(NAMES, st.integers(1, 65535), max_size=2).map(lambda d: d or EMPTY),
    NAMES,
    NAMES,
    UNKNOWN.map(lambda d: d or EMPTY),
    port_protocols=st.dictionaries(NAMES, st.sampled_from(["UDP", "SCTP"]), max_size=2).map(
        lambda d: d or EMPTY
    ),
)


@SETTINGS
@given(SERVICES | ENDPOINTS)
def test_a_record_reads_back_as_written(record):
    read = type(record).from_bytes(record.key, record.to_bytes())
    assert read == record
    assert read.to_bytes() == record.to_bytes()
    assert dict(read.extra) == dict(record.extra)


@SETTINGS
@given(ENDPOINTS, NAMES)
def test_what_repeats_between_records_is_held_once(record, other_pod):
    """Two endpoints of one namespace, node, labels and named ports, decoded apart: one
    string each, one mapping of named ports and one of their protocols."""
    twin = EndpointRecord(
        record.namespace,
        other_pod,
        record.ifname,
        (),
        record.labels,
        record.node,
        dict(record.ports),
        port_protocols=dict(record.port_protocols),
    )
    a = EndpointRecord.from_bytes(record.key, record.to_bytes())
    b = EndpointRecord.from_bytes(twin.key, twin.to_bytes())
    assert a.namespace is b.namespace and a.node is b.node and a.ifname is b.ifname
    for (ka, va), (kb, vb) in zip(sorted(a.labels.items()), sorted(b.labels.items()), strict=True):
        assert ka is kb and va is vb
    assert a.ports is b.ports and a.port_protocols is b.port_protocols
    assert (b.ports is EMPTY) == (not record.ports) and b.extra is EMPTY
    assert (b.port_protocols is EMPTY) == (not record.port_protocols)


@SETTINGS
@given(
    st.dictionaries(
        st.sampled_from(["namespace", "pod", "ifname", "ips", "labels", "node", "ports", "x"]),
        SCALARS | st.lists(SCALARS, max_size=2) | st.dictionaries(NAMES, SCALARS, max_size=2),
    )
    | st.binary(max_size=60),
    st.booleans(),
)
def test_any_stored_value_reads_as_a_record_or_corrupt(value, as_service):
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    assert_reads_or_corrupt(ServiceRecord if as_service else EndpointRecord, "/k", raw)


@SETTINGS
@given(st.lists(LABELS, min_size=1, max_size=6))
def test_equal_labels_are_one_read_only_object_held_while_a_record_holds_it(label_sets):
    records = [
        EndpointRecord.from_bytes(
            f"/ep/{i}", EndpointRecord("ns", f"p{i}", "eth0", (), labels).to_bytes()
        )
        for i, labels in enumerate(label_sets)
    ]
    for a, labels_a in zip(records, label_sets, strict=True):
        assert dict(a.labels) == labels_a
        for b, labels_b in zip(records, label_sets, strict=True):
            assert (a.labels is b.labels) == (labels_a == labels_b)
        if labels_a:
            with pytest.raises(TypeError):
                a.labels["x"] = "y"  # type: ignore[index]
            with pytest.raises(TypeError):
                a.labels.update(x="y")  # type: ignore[attr-defined]
        assert copy.deepcopy(a) == a == pickle.loads(pickle.dumps(a))  # noqa: S301
        assert dataclasses.asdict(a)["labels"] == labels_a
    held = {tuple(sorted(r.labels.items())) for r in records if r.labels}
    del records, a, b
    assert not held & set(_LABELS.keys())  # nothing holds them: the sharing lets go
