"""The store's record codec (store/codec.py) and the IPAM records (ipam/records.py) under
generated input: whatever bytes a key holds, reading gives a record or CorruptRecord (never
another exception); a record written and read back is the same record, the fields it does not
know included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ipam.records import BlockRecord, HandleId, HandleRecord, LeasedIP
from store.codec import CorruptRecord, decode
from store.keys import block_key

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
RAW = (
    st.binary(max_size=200)
    | JSON.map(lambda v: repr(v).encode())
    | st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n)
)
NAMES = st.text("abcdefgh0123456789-", min_size=1, max_size=10)
UNKNOWN = st.dictionaries(st.text("xyz", min_size=1, max_size=4), JSON, max_size=3)
TIME = st.floats(0, 2e9, allow_nan=False)
SETTINGS = settings(max_examples=300, deadline=None, database=None)


@SETTINGS
@given(RAW, st.booleans())
def test_any_stored_value_reads_as_a_record_or_corrupt(value, as_handle):
    key = block_key("p", "10.0.0.0/26")
    try:
        record = (HandleRecord if as_handle else BlockRecord).from_bytes(key, value)
    except CorruptRecord as err:
        assert key in err.msg
    else:
        assert record.to_bytes()  # what was read can be written again


@SETTINGS
@given(RAW)
def test_decode_gives_an_object_or_corrupt(value):
    try:
        assert isinstance(decode("k", value), dict)
    except CorruptRecord:
        pass


ADDRESSES = st.integers(0, 63).map(lambda n: f"10.0.0.{n}")


@SETTINGS
@given(
    st.builds(
        BlockRecord,
        pool=NAMES,
        cidr=st.just("10.0.0.0/26"),
        affinity=NAMES,
        allocations=st.dictionaries(ADDRESSES, NAMES, max_size=4),
        last=st.none() | ADDRESSES,
        claimed_at=TIME,
        extra=UNKNOWN,
        released=st.dictionaries(ADDRESSES, TIME, max_size=3),
        borrowed=st.dictionaries(ADDRESSES, NAMES, max_size=3),
        empty_since=st.none() | TIME,
    )
)
def test_a_block_reads_back_as_written(block):
    key = block_key(block.pool, block.cidr)
    assert BlockRecord.from_bytes(key, block.to_bytes()) == block


@SETTINGS
@given(
    st.builds(HandleId, NAMES, NAMES, NAMES),
    st.lists(
        st.builds(
            LeasedIP,
            ADDRESSES.map(lambda a: f"{a}/16"),
            st.none() | ADDRESSES,
            NAMES,
            st.just("10.0.0.0/26"),
            UNKNOWN,
        ),
        max_size=2,
    ),
    st.dictionaries(NAMES, NAMES, max_size=3),
    TIME,
    UNKNOWN,
)
def test_a_handle_reads_back_as_written_unknown_fields_kept(
    handle, ips, attributes, created, extra
):
    record = HandleRecord(handle, tuple(ips), attributes, created, extra)
    again = HandleRecord.from_bytes(handle.key, record.to_bytes())
    assert again == record and again.extra == extra
    assert [ip.extra for ip in again.ips] == [ip.extra for ip in ips]
