"""kernel/nftelem.py's encoding, without a kernel: every field of a concatenation takes a
multiple of 4 bytes and reads back as what was given, a lone field keeps its own width,
numgen's index is in host order, the messages stay within a 16-bit attribute however many
elements, an element is the attributes the netlink rules build one by one, a flush names no
element, a batch renders as the script it stands for, and what nft would refuse (a bad
address, a port over 65535, a set element with data) is an ElementError.
tests/netns/test_nft_elements.py checks the bytes against nft's."""

from __future__ import annotations

import ipaddress
import socket
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.nftelem import (
    CHUNK,
    COUNTER,
    PROTOCOLS,
    VERDICT,
    CounterChange,
    ElementBatch,
    ElementChange,
    ElementError,
    Removal,
    SetType,
    calc_messages,
    encode_element,
    encode_field,
    encode_value,
    encode_verdict,
    render_script,
)

WIDTH = {"ipv4_addr": 4, "ipv6_addr": 16, "inet_proto": 1, "inet_service": 2, "host_u32": 4}


def text_of(datatype: str) -> st.SearchStrategy[str]:
    if datatype in ("ipv4_addr", "ipv6_addr"):
        v = 4 if datatype == "ipv4_addr" else 6
        return st.ip_addresses(v=v).map(str)
    if datatype == "inet_proto":
        return st.sampled_from(sorted(PROTOCOLS))
    top = {"inet_service": 0xFFFF, "host_u32": 0xFFFFFFFF}[datatype]
    return st.integers(0, top).map(str)


def read_field(datatype: str, data: bytes) -> str:
    if datatype in ("ipv4_addr", "ipv6_addr"):
        return str(ipaddress.ip_address(data))
    if datatype == "inet_proto":
        return {n: name for name, n in PROTOCOLS.items()}[data[0]]
    return str(int.from_bytes(data, "big" if datatype == "inet_service" else "little"))


@st.composite
def typed_value(draw, min_fields: int = 1) -> tuple[tuple[str, ...], str]:
    types = tuple(draw(st.lists(st.sampled_from(sorted(WIDTH)), min_size=min_fields, max_size=5)))
    return types, " . ".join(draw(text_of(t)) for t in types)


@given(typed_value(min_fields=2))
def test_a_concatenation_pads_every_field_to_4_bytes_and_reads_back(typed):
    types, text = typed
    data, offset, fields = encode_value(types, text), 0, []
    for datatype in types:
        fields.append(read_field(datatype, data[offset : offset + WIDTH[datatype]]))
        assert not any(data[offset + WIDTH[datatype] : offset + -(-WIDTH[datatype] // 4) * 4])
        offset += -(-WIDTH[datatype] // 4) * 4
    assert offset == len(data)
    assert fields == text.split(" . ")


@given(typed_value(min_fields=2), st.booleans())
def test_a_concatenation_of_another_number_of_fields_is_an_element_error(typed, more):
    """Every width (two to four are unrolled, five is the general loop) counts its fields."""
    types, text = typed
    other = f"{text} . 1" if more else text.rpartition(" . ")[0]
    with pytest.raises(ElementError, match="does not have the"):
        encode_value(types, other)


@given(st.sampled_from(sorted(WIDTH)).flatmap(lambda t: st.tuples(st.just(t), text_of(t))))
def test_a_lone_field_keeps_its_width(typed):
    datatype, text = typed
    assert len(encode_value((datatype,), text)) == WIDTH[datatype]


def test_numgens_index_is_host_order_and_a_port_network_order():
    assert encode_field("host_u32", "1") == struct.pack("=I", 1)
    assert encode_field("inet_service", "80") == b"\x00\x50"


@pytest.mark.parametrize(
    ("types", "text"),
    [
        (("ipv4_addr",), "10.0.0.300"),
        (("ipv4_addr",), "fd00::1"),
        (("inet_service",), "65536"),
        (("inet_service",), "-1"),
        (("inet_proto",), "tcpx"),
        (("ipv4_addr", "inet_service"), "10.0.0.1"),
        (("verdictish",), "x"),
    ],
)
def test_what_nft_refuses_is_an_element_error(types, text):
    with pytest.raises((ElementError, OSError)):
        encode_value(types, text)


def test_verdicts_and_data_kinds():
    assert encode_verdict("goto lb-2").endswith(b"lb-2\0\0\0\0")
    assert struct.pack(">i", -4) in encode_verdict("goto lb-2")
    with pytest.raises(ElementError):
        encode_verdict("goto")
    with pytest.raises(ElementError):
        encode_element(SetType(("ipv4_addr",)), "10.0.0.1", "drop")  # a set: no data


@given(st.integers(0, 3 * CHUNK))
def test_messages_keep_the_element_list_within_a_16_bit_attribute(count):
    kind = SetType(
        ("ipv6_addr", "inet_proto", "inet_service", "host_u32"), ("ipv6_addr", "inet_service")
    )
    elements = tuple(
        (f"fd00::{i:x} . tcp . 80 . {i}", f"fd01::{i:x} . 8080") for i in range(count)
    )
    messages = calc_messages("ip6", "t", [ElementChange("add", "m", kind, elements)])
    assert len(messages) == -(-count // CHUNK)
    for _kind, body in messages:
        assert len(body) < 0xFFFF


def test_a_map_add_without_data_is_refused_and_a_delete_needs_none():
    kind = SetType(("ipv4_addr",), VERDICT)
    with pytest.raises(ElementError):
        calc_messages("ip", "t", [ElementChange("add", "m", kind, (("10.0.0.1", None),))])
    ((_kind, msg),) = calc_messages(
        "ip", "t", [ElementChange("delete", "m", kind, (("10.0.0.1", "drop"),))]
    )
    assert socket.inet_aton("10.0.0.1") in msg and b"drop" not in msg


def reference_element(set_type: SetType, key: str, data: str | None) -> bytes:
    """NFTA_LIST_ELEM as the netlink attribute rules build it, one attribute at a time: a
    (length, type) header, the payload, padding to 4 bytes; nested ones flagged 0x8000."""

    def attr(kind: int, payload: bytes) -> bytes:
        return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)

    def nest(kind: int, *parts: bytes) -> bytes:
        return attr(kind | 0x8000, b"".join(parts))

    def value(types: tuple[str, ...], text: str) -> bytes:
        fields = [encode_field(t, f) for t, f in zip(types, text.split(" . "), strict=True)]
        if len(fields) == 1:
            return fields[0]
        return b"".join(f + b"\0" * (-len(f) % 4) for f in fields)

    parts = [nest(1, attr(1, value(set_type.key, key)))]  # ELEM_KEY { DATA_VALUE }
    if data is not None and set_type.data == VERDICT:
        parts.append(nest(2, encode_verdict(data)))  # ELEM_DATA { DATA_VERDICT }
    elif data is not None:
        parts.append(nest(2, attr(1, value(set_type.data, data))))  # ELEM_DATA { DATA_VALUE }
    return nest(1, *parts)


@st.composite
def typed_element(draw) -> tuple[SetType, str, str | None]:
    key_types, key = draw(typed_value())
    kind = draw(st.sampled_from(("set", "verdict", "value")))
    if kind == "set":
        return SetType(key_types), key, None
    if kind == "verdict":
        chain = draw(st.from_regex(r"[a-z][a-z0-9-]{0,30}", fullmatch=True))
        verdict = draw(st.sampled_from(("drop", "accept", f"goto {chain}", f"jump {chain}")))
        return SetType(key_types, VERDICT), key, verdict
    data_types, data = draw(typed_value())
    return SetType(key_types, data_types), key, data


@given(typed_element())
def test_an_element_is_encoded_as_its_attributes_built_one_by_one(element):
    """The encoders packed once per set type (the headers of fixed-width values, a verdict's
    attribute per distinct verdict) write what the attributes built one by one give."""
    set_type, key, data = element
    assert encode_element(set_type, key, data) == reference_element(set_type, key, data)
    assert encode_element(set_type, key, data) == reference_element(set_type, key, data)


def test_a_flush_names_its_set_and_no_element():
    kind = SetType(("ipv4_addr",), VERDICT)
    ((msg_type, body),) = calc_messages("ip", "t", [ElementChange("flush", "m", kind, ())])
    assert msg_type == 14  # NFT_MSG_DELSETELEM
    assert body.endswith(struct.pack("=HH", 6, 2) + b"m\0\0\0")  # NFTA_SET_ELEM_LIST_SET last
    with pytest.raises(ElementError):
        calc_messages("ip", "t", [ElementChange("replace", "m", kind, ())])


def test_a_batch_renders_as_the_nft_script_it_stands_for():
    hairpin, verdicts = SetType(("ipv4_addr", "ipv4_addr")), SetType(("inet_service",), VERDICT)
    batch = ElementBatch(
        "ip",
        "t",
        (
            ElementChange("flush", "h", hairpin, ()),
            ElementChange("flush", "m", verdicts, ()),
            ElementChange("delete", "m", verdicts, (("80", "drop"),)),
            ElementChange("add", "m", verdicts, (("443", "goto b"), ("22", "drop"))),
            ElementChange("add", "h", hairpin, ()),
        ),
    )
    assert render_script(batch) == (
        "flush set ip t h\n"
        "flush map ip t m\n"
        "delete element ip t m { 80 }\n"
        "add element ip t m { 22 : drop, 443 : goto b }\n"
    )


def test_counters_are_added_before_the_elements_and_deleted_after_them():
    """A counter map's element names its counter: the kernel checks the name when the
    element is added, and refuses to delete a counter an element still names."""
    counters = SetType(("ipv4_addr",), COUNTER)
    batch = ElementBatch(
        "inet",
        "t",
        (
            ElementChange("delete", "c", counters, (("10.0.0.1", None),)),
            ElementChange("add", "c", counters, (("10.0.0.2", '"n/b"'),)),
        ),
        (CounterChange("delete", "n/a"), CounterChange("add", "n/b")),
    )
    kinds = [kind for kind, _body in calc_messages("inet", "t", batch.changes, batch.counters)]
    assert kinds == [18, 14, 12, 20]  # NEWOBJ, DELSETELEM, NEWSETELEM, DELOBJ
    assert render_script(batch) == (
        "add counter inet t n/b\n"
        "delete element inet t c { 10.0.0.1 }\n"
        'add element inet t c { 10.0.0.2 : "n/b" }\n'
        "delete counter inet t n/a\n"
    )
    with pytest.raises(ElementError):
        calc_messages("inet", "t", (), [CounterChange("reset", "n/a")])


def test_removals_follow_the_elements_chains_flushed_first_then_sets_then_counters():
    """A chain leaves as nft's ``flush chain`` then ``delete chain`` (no vmap element jumps
    to it once the element changes are in), then the sets and maps only its rules named, then
    the counters."""
    verdicts = SetType(("ipv4_addr",), VERDICT)
    batch = ElementBatch(
        "inet",
        "t",
        (ElementChange("delete", "m", verdicts, (("10.0.0.1", None),)),),
        (CounterChange("delete", "n/a"),),
        (Removal("chain", "in-1"), Removal("set", "pods4-1"), Removal("map", "m2")),
    )
    messages = calc_messages("inet", "t", batch.changes, batch.counters, batch.removals)
    assert [kind for kind, _body in messages] == [14, 8, 5, 11, 11, 20]
    assert b"in-1\0" in messages[1][1] and b"in-1\0" in messages[2][1]
    assert b"pods4-1\0" in messages[3][1] and b"m2\0" in messages[4][1]
    assert render_script(batch) == (
        "delete element inet t m { 10.0.0.1 }\n"
        "flush chain inet t in-1\n"
        "delete chain inet t in-1\n"
        "delete set inet t pods4-1\n"
        "delete map inet t m2\n"
        "delete counter inet t n/a\n"
    )
    with pytest.raises(ElementError):
        calc_messages("inet", "t", (), (), [Removal("table", "t")])
