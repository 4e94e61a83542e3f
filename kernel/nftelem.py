"""Set and map element changes sent as one nfnetlink batch, without libnftables.

libnftables (1.0.6) reads the declarations of the table's sets and chains before it runs a
command whenever the kernel's ruleset generation moved, and every transaction moves it. With
thousands of sets (the proxy's per-endpoint ``clients-`` sets) that refill is several ms for one
element. The kernel needs none of it to change an element: the table and set names, the key's
bytes and the data's. This module writes those bytes as libnftables writes them for the few
datatypes it knows (tests/netns/test_nft_elements.py compares both paths' listings), and
sends one batch of NEWSETELEM/DELSETELEM messages: atomic, as one ``nft -f`` script is.

Values are nft text (``10.0.0.1 . tcp . 80``); a type is a tuple of datatype names, one per
field of a concatenation; a map's data is a verdict, a value or a named counter (an object
map's reference: NetworkPolicy's drop counters). Interval sets (start and end elements,
merges) are not handled.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 16, 17
NFT_MSG_NEWSETELEM, NFT_MSG_DELSETELEM = 12, 14
NLM_F_REQUEST, NLM_F_ACK, NLM_F_CREATE = 0x1, 0x4, 0x400
NLMSG_ERROR = 2
SOL_NETLINK, NETLINK_CAP_ACK = 270, 10
NLA_F_NESTED = 0x8000
NFPROTO = {"inet": 1, "ip": 2, "ip6": 10}
# attribute numbers (linux/netfilter/nf_tables.h)
LIST_TABLE, LIST_SET, LIST_ELEMENTS, LIST_ELEM = 1, 2, 3, 1
ELEM_KEY, ELEM_DATA, ELEM_OBJREF, DATA_VALUE, DATA_VERDICT = 1, 2, 9, 1, 2
VERDICT_CODE, VERDICT_CHAIN = 1, 2
VERDICTS = {"drop": 0, "accept": 1, "continue": -1, "return": -5}
JUMPS = {"jump": -3, "goto": -4}
PROTOCOLS = {"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1, "icmpv6": 58}
VERDICT = ("verdict",)
COUNTER = ("counter",)  # an object map's data: a named counter (``"dropped-in/x/a"``)
DATATYPES = frozenset({"ipv4_addr", "ipv6_addr", "inet_proto", "inet_service", "host_u32"})
#: elements per message: the element list is one attribute, whose length is 16 bits
CHUNK = 256


class ElementError(Exception):
    """The kernel refused the batch (nothing of it was applied), or a value has no encoding."""


@dataclass(frozen=True)
class SetType:
    """A set's key datatypes and a map's data datatypes (``VERDICT``, ``COUNTER``; None: a
    set)."""

    key: tuple[str, ...]
    data: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ElementChange:
    """``verb`` (add | delete) these elements (key text, data text or None) of one set."""

    verb: str
    set: str
    type: SetType
    elements: tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class ElementBatch:
    """Element changes of one table, applied together (``Nft.run_elements``)."""

    family: str  # ip | ip6 | inet
    table: str
    changes: tuple[ElementChange, ...]


def encode_field(datatype: str, text: str) -> bytes:
    """One field's bytes, as libnftables stores them (network order but the host-order
    ``host_u32``: numgen's value, an integer in host order)."""
    if datatype == "ipv4_addr":
        return socket.inet_pton(socket.AF_INET, text)
    if datatype == "ipv6_addr":
        return socket.inet_pton(socket.AF_INET6, text)
    if datatype == "inet_proto":
        number = PROTOCOLS.get(text)
        return bytes([number if number is not None else _number(text, 0xFF)])
    if datatype == "inet_service":
        return struct.pack(">H", _number(text, 0xFFFF))
    if datatype == "host_u32":
        return struct.pack("=I", _number(text, 0xFFFFFFFF))
    raise ElementError(f"no encoding for datatype {datatype}")


def _number(text: str, limit: int) -> int:
    if not text.isdigit() or int(text) > limit:
        raise ElementError(f"not a number up to {limit}: {text!r}")
    return int(text)


def encode_value(types: Sequence[str], text: str) -> bytes:
    """A key or data value: one field alone, or a concatenation whose fields each take a
    multiple of 4 bytes (nftables registers are 32 bits wide)."""
    fields = text.split(" . ")
    if len(fields) != len(types):
        raise ElementError(f"{text!r} does not have the {len(types)} fields of {types}")
    if len(types) == 1:
        return encode_field(types[0], fields[0])
    return b"".join(_padded(encode_field(t, f)) for t, f in zip(types, fields, strict=True))


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def encode_verdict(text: str) -> bytes:
    """``drop``, ``accept``, ``goto CHAIN`` … as an NFTA_DATA_VERDICT attribute."""
    word, _, chain = text.partition(" ")
    if word in JUMPS and chain:
        return _nest(
            DATA_VERDICT,
            _attr(VERDICT_CODE, struct.pack(">i", JUMPS[word])),
            _attr(VERDICT_CHAIN, chain.encode() + b"\0"),
        )
    if word in VERDICTS and not chain:
        return _nest(DATA_VERDICT, _attr(VERDICT_CODE, struct.pack(">i", VERDICTS[word])))
    raise ElementError(f"not a verdict: {text!r}")


def encode_element(set_type: SetType, key: str, data: str | None) -> bytes:
    """One NFTA_LIST_ELEM: its key, and a map's data (a delete may leave the data out)."""
    parts = [_nest(ELEM_KEY, _attr(DATA_VALUE, encode_value(set_type.key, key)))]
    if data is not None:
        if set_type.data is None:
            raise ElementError(f"{key!r}: a set's element has no data ({data!r})")
        parts.append(encode_data(set_type.data, data))
    return _nest(LIST_ELEM, *parts)


def encode_data(types: tuple[str, ...], text: str) -> bytes:
    """A map element's data: a verdict, a counter's name (an object reference, as nft
    quotes it or not) or a value."""
    if types == VERDICT:
        return _nest(ELEM_DATA, encode_verdict(text))
    if types == COUNTER:
        return _attr(ELEM_OBJREF, text.strip('"').encode() + b"\0")
    return _nest(ELEM_DATA, _attr(DATA_VALUE, encode_value(types, text)))


def calc_messages(
    family: str, table: str, changes: Iterable[ElementChange]
) -> list[tuple[int, bytes]]:
    """The batch's messages, (NFT_MSG_* type, body without the netlink header): one per
    CHUNK elements of a set."""
    head = struct.pack("=BBH", NFPROTO[family], 0, 0)
    names = _attr(LIST_TABLE, table.encode() + b"\0")
    out = []
    for change in changes:
        if change.verb not in ("add", "delete"):
            raise ElementError(f"no such element verb: {change.verb}")
        add = change.verb == "add"
        if add and change.type.data is not None and any(v is None for _, v in change.elements):
            raise ElementError(f"an element of map {change.set} without data")
        kind = NFT_MSG_NEWSETELEM if add else NFT_MSG_DELSETELEM
        elements = [encode_element(change.type, k, v if add else None) for k, v in change.elements]
        for i in range(0, len(elements), CHUNK):
            body = names + _attr(LIST_SET, change.set.encode() + b"\0")
            body += _nest(LIST_ELEMENTS, *elements[i : i + CHUNK])
            out.append((kind, head + body))
    return out


def _attr(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + _padded(payload)


def _nest(kind: int, *parts: bytes) -> bytes:
    return _attr(kind | NLA_F_NESTED, b"".join(parts))


class ElementSocket:
    """A NETLINK_NETFILTER socket of the netns it was opened in; ``commit`` sends one batch.
    Not thread-safe: the caller serialises (kernel/nft.py's ``Nft`` holds its lock)."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        # an error answer then echoes the refused message's header only, not the message
        self._sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        self._sock.bind((0, 0))
        self._seq = 0

    def commit(self, messages: Sequence[tuple[int, bytes]]) -> None:
        """Send BEGIN, ``messages`` (each acked), END; the kernel handles the batch within
        the send, so every answer is queued when it returns. ElementError on a refusal."""
        if not messages:
            return
        first = self._seq + 1
        self._seq += len(messages) + 2
        batch = [_header(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, first, _batch_body())]
        flags = NLM_F_REQUEST | NLM_F_ACK
        for i, (kind, body) in enumerate(messages):
            extra = NLM_F_CREATE if kind == NFT_MSG_NEWSETELEM else 0
            type_ = (NFNL_SUBSYS_NFTABLES << 8) | kind
            batch.append(_header(type_, flags | extra, first + 1 + i, body))
        batch.append(
            _header(NFNL_MSG_BATCH_END, NLM_F_REQUEST, first + len(messages) + 1, _batch_body())
        )
        self._sock.sendall(b"".join(batch))
        self._read_acks(first, len(messages))

    def _read_acks(self, first: int, count: int) -> None:
        acked, failed = 0, []
        while True:
            try:
                data = self._sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            for seq, code in _errors(data):
                if not first <= seq <= first + count:
                    continue  # an earlier batch's, left when its send failed
                acked += seq > first
                if code:
                    failed.append((seq - first - 1, code))
        if failed:  # index -1: the commit itself (answered on BEGIN's sequence number)
            index, code = min(failed)
            raise ElementError(f"{os.strerror(code)} (message {index} of the batch)")
        if acked < count:
            raise ElementError(f"{count - acked} of {count} messages unanswered")

    def close(self) -> None:
        self._sock.close()


def _batch_body() -> bytes:
    return struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(NFNL_SUBSYS_NFTABLES))


def _header(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body


def _errors(data: bytes) -> list[tuple[int, int]]:
    """(seq, errno) of each NLMSG_ERROR (errno 0: an ack) in one read."""
    out, offset = [], 0
    while offset + 16 <= len(data):
        length, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", data, offset)
        if kind == NLMSG_ERROR:
            out.append((seq, -struct.unpack_from("=i", data, offset + 16)[0]))
        offset += max((length + 3) & ~3, 16)
    return out
