"""kernel/nftelem.py's encoding, without a kernel: every field of a concatenation takes a
multiple of 4 bytes and reads back as what was given, a lone field keeps its own width,
numgen's index is in host order, the messages stay within a 16-bit attribute however many
elements, and what nft would refuse (a bad address, a port over 65535, a set element with
data) is an ElementError. tests/netns/test_nft_elements.py checks the bytes against nft's."""

from __future__ import annotations

import ipaddress
import socket
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.nftelem import (
    CHUNK,
    PROTOCOLS,
    VERDICT,
    ElementChange,
    ElementError,
    SetType,
    calc_messages,
    encode_element,
    encode_field,
    encode_value,
    encode_verdict,
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
