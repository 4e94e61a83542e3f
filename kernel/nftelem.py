"""Set and map element changes sent as one nfnetlink batch, without libnftables.

libnftables (1.0.6) reads the declarations of the table's sets and chains before it runs a
command whenever the kernel's ruleset generation moved, and every transaction moves it. With
thousands of sets (the proxy's per-endpoint ``clients-`` sets) that refill is several ms for one
element. The kernel needs none of it to change an element: the table and set names, the key's
bytes and the data's. This module writes those bytes as libnftables writes them for the few
datatypes it knows (tests/netns/test_nft_elements.py compares both paths' listings), and
sends one batch of NEWSETELEM/DELSETELEM messages: atomic, as one ``nft -f`` script is. A
batch may also add and delete named counters (NEWOBJ/DELOBJ: NetworkPolicy's per-Pod drop
counters, which its counter maps name), the adds before the elements and the deletes after
them, as nft orders the same script.

Values are nft text (``10.0.0.1 . tcp . 80``); a type is a tuple of datatype names, one per
field of a concatenation; a map's data is a verdict, a value or a named counter (an object
map's reference: NetworkPolicy's drop counters). An element may carry a comment (the
masquerade table's attachment tags). Of the interval sets only concatenations are handled
(the kernel's pipapo sets: one element with a key and a key end, a field a prefix
``10.0.0.0/24``, a range ``a-b`` or one value); an interval set of one field (start and end
elements, merges) is not.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import os
import socket
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 16, 17
NFT_MSG_NEWSETELEM, NFT_MSG_DELSETELEM = 12, 14
NFT_MSG_NEWOBJ, NFT_MSG_GETOBJ, NFT_MSG_DELOBJ = 18, 19, 20
NFT_MSG_DELCHAIN, NFT_MSG_DELRULE, NFT_MSG_DELSET = 5, 8, 11
NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE = 3, 6
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP, NLM_F_CREATE, NLM_F_APPEND = 0x1, 0x4, 0x300, 0x400, 0x800
NLMSG_ERROR, NLMSG_DONE = 2, 3
SOL_NETLINK, NETLINK_CAP_ACK = 270, 10
SO_SNDBUFFORCE = 32  # socket(7); the socket module does not name it
SEND_SLACK = 64 * 1024  # the kernel counts each skb's overhead against the buffer too
NLA_F_NESTED = 0x8000
NFPROTO = {"inet": 1, "ip": 2, "ip6": 10}
# attribute numbers (linux/netfilter/nf_tables.h)
LIST_TABLE, LIST_SET, LIST_ELEMENTS, LIST_ELEM = 1, 2, 3, 1
ELEM_KEY, ELEM_DATA, ELEM_OBJREF, DATA_VALUE, DATA_VERDICT = 1, 2, 9, 1, 2
ELEM_USERDATA, ELEM_KEY_END = 6, 10
UDATA_ELEM_COMMENT = 0  # libnftnl's NFTNL_UDATA_SET_ELEM_COMMENT: type, length, text + NUL
VERDICT_CODE, VERDICT_CHAIN = 1, 2
OBJ_TABLE, OBJ_NAME, OBJ_TYPE, OBJ_DATA = 1, 2, 3, 4
CHAIN_TABLE, CHAIN_NAME, RULE_TABLE, RULE_CHAIN, SET_TABLE, SET_NAME = 1, 3, 1, 2, 1, 2
RULE_EXPRESSIONS = 4
OBJECT_COUNTER, COUNTER_BYTES, COUNTER_PACKETS = 1, 1, 2
CREATING = frozenset({NFT_MSG_NEWSETELEM, NFT_MSG_NEWOBJ, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE})
APPENDING = frozenset({NFT_MSG_NEWRULE})  # sent with NLM_F_APPEND too: after the chain's last
VERDICTS = {"drop": 0, "accept": 1, "continue": -1, "return": -5}
JUMPS = {"jump": -3, "goto": -4}
PROTOCOLS = {"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1, "icmpv6": 58}
VERDICT = ("verdict",)
COUNTER = ("counter",)  # an object map's data: a named counter (``"dropped-in/x/a"``)
#: each datatype's width in bytes (a field of a concatenation takes a multiple of 4)
WIDTH = {
    "ipv4_addr": 4,
    "ipv6_addr": 16,
    "inet_proto": 1,
    "inet_service": 2,
    "host_u32": 4,
    "ifname": 16,  # IFNAMSIZ: the name, zero-padded
}
DATATYPES = frozenset(WIDTH)
#: elements per message: the element list is one attribute, whose length is 16 bits
CHUNK = 256
VERBS = ("add", "delete", "flush")


class ElementError(Exception):
    """The kernel refused the batch (nothing of it was applied), or a value has no encoding."""


@dataclass(frozen=True)
class SetType:
    """A set's key datatypes and a map's data datatypes (``VERDICT``, ``COUNTER``; None: a
    set); ``interval``: a concatenation with ``flags interval``."""

    key: tuple[str, ...]
    data: tuple[str, ...] | None = None
    interval: bool = False


@dataclass(frozen=True)
class ElementChange:
    """``verb`` (add | delete) these elements (key text, data text or None) of one set, or
    ``flush`` it (every element; ``elements`` empty). ``comments``: the added elements'
    comments, in their order (empty: none; an empty one: that element has none)."""

    verb: str
    set: str
    type: SetType
    elements: tuple[tuple[str, str | None], ...]
    comments: tuple[str, ...] = ()


@dataclass(frozen=True)
class CounterChange:
    """``verb`` (add | delete) the named counter ``name`` (added: zeroed; one already there
    is kept as it is, as ``add counter`` keeps it)."""

    verb: str
    name: str


@dataclass(frozen=True)
class NewChain:
    """A regular chain added with its rules (``rules``: nft text, for the script the batch
    stands for; ``expressions``: each rule's NFTA_RULE_EXPRESSIONS, ``kernel/nftrule.py``),
    before the element changes, whose verdicts may jump to it."""

    name: str
    rules: tuple[str, ...]
    expressions: tuple[bytes, ...]


@dataclass(frozen=True)
class Removal:
    """A chain (its rules flushed first), set or map of the table deleted (``kind``: chain |
    set | map): once the element changes took the references to it away."""

    kind: str
    name: str


@dataclass(frozen=True)
class ElementBatch:
    """Element changes of one table, applied together (``Nft.run_elements``); ``counters``:
    named counters added before them and deleted after them; ``chains``: added with their
    rules after the counters, before the elements; ``removals``: chains, then sets and maps,
    deleted after them (before the counters), as ``nft`` runs ``flush chain``, ``delete
    chain``, ``delete set``."""

    family: str  # ip | ip6 | inet
    table: str
    changes: tuple[ElementChange, ...]
    counters: tuple[CounterChange, ...] = ()
    removals: tuple[Removal, ...] = ()
    chains: tuple[NewChain, ...] = ()


def encode_field(datatype: str, text: str) -> bytes:
    """One field's bytes, as libnftables stores them (network order but the host-order
    ``host_u32``: numgen's value, an integer in host order)."""
    return _field_encoder(datatype)(text)


@functools.cache
def _field_encoder(datatype: str, padded: bool = False) -> Callable[[str], bytes]:
    """``encode_field`` for one datatype, looked up once per set type rather than per element
    (a full render writes ~85k of them); ``padded``: as a field of a concatenation. Numbers
    are packed once per distinct text (protocols, ports and numgen's indexes repeat)."""
    if datatype in ("ipv4_addr", "ipv6_addr"):
        return functools.partial(
            socket.inet_pton, socket.AF_INET if datatype == "ipv4_addr" else socket.AF_INET6
        )
    if datatype == "inet_proto":
        pad = b"\0\0\0" if padded else b""
        return functools.lru_cache(maxsize=256)(lambda text: bytes([_protocol(text)]) + pad)
    if datatype == "inet_service":
        port = struct.Struct(">Hxx" if padded else ">H")
        return functools.lru_cache(maxsize=8192)(lambda text: port.pack(_number(text, 0xFFFF)))
    if datatype == "host_u32":
        return functools.lru_cache(maxsize=8192)(
            lambda text: struct.pack("=I", _number(text, 0xFFFFFFFF))
        )
    if datatype == "ifname":
        return _ifname
    raise ElementError(f"no encoding for datatype {datatype}")


def _ifname(text: str) -> bytes:
    """An interface name as nft writes it (quoted or not): its bytes, zero-padded to 16."""
    name = text[1:-1] if len(text) > 1 and text[0] == text[-1] == '"' else text
    raw = name.encode()
    if not 0 < len(raw) < WIDTH["ifname"] or b"\0" in raw:
        raise ElementError(f"not an interface name: {text!r}")
    return raw.ljust(WIDTH["ifname"], b"\0")


def _protocol(text: str) -> int:
    number = PROTOCOLS.get(text)
    return number if number is not None else _number(text, 0xFF)


def _number(text: str, limit: int) -> int:
    if not text.isdigit() or int(text) > limit:
        raise ElementError(f"not a number up to {limit}: {text!r}")
    return int(text)


def encode_value(types: Sequence[str], text: str) -> bytes:
    """A key or data value: one field alone, or a concatenation whose fields each take a
    multiple of 4 bytes (nftables registers are 32 bits wide)."""
    return _value_encoder(tuple(types))(text)


@functools.cache
def _value_encoder(types: tuple[str, ...]) -> Callable[[str], bytes]:
    if len(types) == 1:
        alone = _field_encoder(types[0])

        def encode_alone(text: str) -> bytes:
            if " . " in text:
                raise ElementError(f"{text!r} does not have the 1 field of {types}")
            return alone(text)

        return encode_alone
    fields = tuple(_field_encoder(t, padded=True) for t in types)

    def wrong(text: str) -> ElementError:
        return ElementError(f"{text!r} does not have the {len(types)} fields of {types}")

    # the common widths unrolled: a full render encodes ~140k keys and values, and a loop
    # over the fields (a list, a zip, a join) took twice as long (1.8 against 0.85 µs)
    if len(fields) == 2:
        f0, f1 = fields

        def encode_two(text: str) -> bytes:
            try:
                a, b = text.split(" . ")
            except ValueError:
                raise wrong(text) from None
            return f0(a) + f1(b)

        return encode_two
    if len(fields) == 3:
        f0, f1, f2 = fields

        def encode_three(text: str) -> bytes:
            try:
                a, b, c = text.split(" . ")
            except ValueError:
                raise wrong(text) from None
            return f0(a) + f1(b) + f2(c)

        return encode_three
    if len(fields) == 4:
        f0, f1, f2, f3 = fields

        def encode_four(text: str) -> bytes:
            try:
                a, b, c, d = text.split(" . ")
            except ValueError:
                raise wrong(text) from None
            return f0(a) + f1(b) + f2(c) + f3(d)

        return encode_four

    def encode_fields(text: str) -> bytes:
        parts = text.split(" . ")
        if len(parts) != len(fields):
            raise wrong(text)
        return b"".join([f(p) for f, p in zip(fields, parts, strict=True)])

    return encode_fields


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def encode_verdict(text: str) -> bytes:
    """``drop``, ``accept``, ``goto CHAIN`` … as an NFTA_DATA_VERDICT attribute."""
    word, _, chain = text.partition(" ")
    if word in JUMPS and chain:
        return _nest(
            DATA_VERDICT,
            _attr(VERDICT_CODE, struct.pack(">i", JUMPS[word])),
            _attr(VERDICT_CHAIN, _name(chain)),
        )
    if word in VERDICTS and not chain:
        return _nest(DATA_VERDICT, _attr(VERDICT_CODE, struct.pack(">i", VERDICTS[word])))
    raise ElementError(f"not a verdict: {text!r}")


def encode_element(set_type: SetType, key: str, data: str | None) -> bytes:
    """One NFTA_LIST_ELEM: its key, and a map's data (a delete may leave the data out)."""
    return _element_encoder(set_type)(key, data)


def encode_comment(comment: str) -> bytes:
    """An element's comment as its NFTA_SET_ELEM_USERDATA attribute (libnftnl's TLV)."""
    text = comment.encode() + b"\0"
    if len(text) > 255:
        raise ElementError(f"a comment longer than 254 bytes: {comment[:40]!r}...")
    return _attr(ELEM_USERDATA, bytes([UDATA_ELEM_COMMENT, len(text)]) + text)


def _commented(element: bytes, comment: str) -> bytes:
    """``element`` (an NFTA_LIST_ELEM) with ``comment`` added to its attributes."""
    extra = encode_comment(comment)
    return struct.pack("=HH", len(element) + len(extra), LIST_ELEM | NLA_F_NESTED) + (
        element[4:] + extra
    )


def calc_span(types: Sequence[str], text: str) -> tuple[str, str]:
    """A concatenation of an interval set as its first and last keys: each field a prefix
    (``10.0.0.0/24``), a range (``a-b``) or one value."""
    starts, ends = [], []
    for datatype, part in zip(types, text.split(" . "), strict=False):
        low, high = part, part
        if datatype in ("ipv4_addr", "ipv6_addr") and "/" in part:
            try:
                net = ipaddress.ip_network(part)
            except ValueError as exc:
                raise ElementError(f"not a prefix: {part!r}") from exc
            low, high = str(net.network_address), str(net.broadcast_address)
        elif datatype != "ifname" and "-" in part:
            low, _, high = part.partition("-")
        starts.append(low)
        ends.append(high)
    return " . ".join(starts), " . ".join(ends)


@functools.cache
def _element_encoder(set_type: SetType) -> Callable[[str, str | None], bytes]:
    """``encode_element`` for one set type: every datatype has a fixed width, so the key's
    attribute headers are the same for every element and are packed once; a map's data
    is packed once per distinct value when it is a verdict or a counter (a few hundred
    chains), with fixed headers when it is a value. An interval set's element is its key
    and its key end (``calc_span``)."""
    if set_type.interval:
        return _span_encoder(set_type)
    key_of = _value_encoder(set_type.key)
    key_head, key_pad = _value_head(ELEM_KEY, set_type.key)
    data_of = _data_encoder(set_type.data) if set_type.data is not None else None
    head = struct.Struct("=HH")
    elem = LIST_ELEM | NLA_F_NESTED

    def encode_one(key: str, data: str | None) -> bytes:
        body = key_head + key_of(key) + key_pad
        if data is not None:
            if data_of is None:
                raise ElementError(f"{key!r}: a set's element has no data ({data!r})")
            body += data_of(data)
        return head.pack(4 + len(body), elem) + body

    if set_type.data is None or set_type.data in (VERDICT, COUNTER):
        return encode_one
    # a value's width is fixed too: such an element's length and headers are packed once
    # (the backends maps: ~60k of a full render's ~85k elements)
    value_of = _value_encoder(set_type.data)
    data_head, data_pad = _value_head(ELEM_DATA, set_type.data)
    width = 4 + len(key_head) + _width(set_type.key) + len(key_pad)
    width += len(data_head) + _width(set_type.data) + len(data_pad)
    start, middle = head.pack(width, elem) + key_head, key_pad + data_head

    def encode_valued(key: str, data: str | None) -> bytes:
        if data is None:
            return encode_one(key, data)
        return start + key_of(key) + middle + value_of(data) + data_pad

    return encode_valued


def _width(types: tuple[str, ...]) -> int:
    """A value's bytes: a lone field's own width, a concatenation's fields 4-byte aligned."""
    return sum(-(-WIDTH[t] // 4) * 4 for t in types) if len(types) > 1 else WIDTH[types[0]]


def _span_encoder(set_type: SetType) -> Callable[[str, str | None], bytes]:
    if len(set_type.key) < 2 or set_type.data is not None:
        raise ElementError(f"interval set of {set_type.key}: only a concatenation's is encoded")
    key_of = _value_encoder(set_type.key)
    key_head, key_pad = _value_head(ELEM_KEY, set_type.key)
    end_head, end_pad = _value_head(ELEM_KEY_END, set_type.key)
    head = struct.Struct("=HH")
    elem = LIST_ELEM | NLA_F_NESTED

    def encode_span(key: str, data: str | None) -> bytes:
        if data is not None:
            raise ElementError(f"{key!r}: a set's element has no data ({data!r})")
        low, high = calc_span(set_type.key, key)
        body = key_head + key_of(low) + key_pad + end_head + key_of(high) + end_pad
        return head.pack(4 + len(body), elem) + body

    return encode_span


def _value_head(kind: int, types: tuple[str, ...]) -> tuple[bytes, bytes]:
    """The two attribute headers (``kind`` nesting NFTA_DATA_VALUE) before a value of
    ``types``, and the padding after it (a lone 1- or 2-byte field's)."""
    width = _width(types)
    pad = b"\0" * (-width % 4)
    inner = struct.pack("=HH", 4 + width, DATA_VALUE)
    return struct.pack("=HH", 4 + len(inner) + width + len(pad), kind | NLA_F_NESTED) + inner, pad


@functools.cache
def _data_encoder(types: tuple[str, ...]) -> Callable[[str], bytes]:
    """A map element's data: a verdict, a counter's name (an object reference, as nft
    quotes it or not) or a value."""
    if types == VERDICT:
        return functools.lru_cache(maxsize=4096)(
            lambda text: _nest(ELEM_DATA, encode_verdict(text))
        )
    if types == COUNTER:
        return functools.lru_cache(maxsize=4096)(
            lambda text: _attr(ELEM_OBJREF, _name(text.strip('"')))
        )
    value_of, (head, pad) = _value_encoder(types), _value_head(ELEM_DATA, types)
    return lambda text: head + value_of(text) + pad


def render_script(batch: ElementBatch) -> str:
    """The same changes as one nft script (what the batch stands for: tests, golden files,
    a plan shown whole), each set's elements sorted by key."""
    t = f"{batch.family} {batch.table}"
    out = [f"add counter {t} {c.name}\n" for c in batch.counters if c.verb == "add"]
    out += [f"add chain {t} {c.name}\n" for c in batch.chains]
    out += [f"add rule {t} {c.name} {r}\n" for c in batch.chains for r in c.rules]
    for change in batch.changes:
        kind = "set" if change.type.data is None else "map"
        if change.verb == "flush":
            out.append(f"flush {kind} {t} {change.set}\n")
        elif change.elements:
            add = change.verb == "add"
            comments = change.comments if add else ()
            items = ", ".join(
                (k if v is None or not add else f"{k} : {v}") + (f' comment "{c}"' if c else "")
                for (k, v), c in sorted(
                    zip(change.elements, comments or [""] * len(change.elements), strict=True)
                )
            )
            out.append(f"{change.verb} element {t} {change.set} {{ {items} }}\n")
    chains = [r.name for r in batch.removals if r.kind == "chain"]
    out += [f"flush chain {t} {c}\n" for c in chains]
    out += [f"delete chain {t} {c}\n" for c in chains]
    out += [f"delete {r.kind} {t} {r.name}\n" for r in batch.removals if r.kind != "chain"]
    out += [f"delete counter {t} {c.name}\n" for c in batch.counters if c.verb == "delete"]
    return "".join(out)


def calc_messages(
    family: str,
    table: str,
    changes: Iterable[ElementChange],
    counters: Iterable[CounterChange] = (),
    removals: Iterable[Removal] = (),
    chains: Iterable[NewChain] = (),
) -> list[tuple[int, bytes]]:
    """The batch's messages, (NFT_MSG_* type, body without the netlink header): the counters
    added, then one message per CHUNK elements of a set (a flush is one DELSETELEM naming no
    element: the kernel then deletes them all), then the removals (each chain's rules, a
    DELRULE naming the chain alone, then the chains, then the sets and maps), then the
    counters deleted (no element names them by then)."""
    head = struct.pack("=BBH", NFPROTO[family], 0, 0)
    names = _attr(LIST_TABLE, _name(table))
    counters = tuple(counters)
    if any(c.verb not in ("add", "delete") for c in counters):
        raise ElementError(f"no such counter verb: {[c.verb for c in counters]}")
    out = [_counter_message(head, names, c) for c in counters if c.verb == "add"]
    for chain in chains:
        named = _attr(CHAIN_TABLE, _name(table)) + _attr(CHAIN_NAME, _name(chain.name))
        out.append((NFT_MSG_NEWCHAIN, head + named))
        rule_of = head + _attr(RULE_TABLE, _name(table)) + _attr(RULE_CHAIN, _name(chain.name))
        out += [(NFT_MSG_NEWRULE, rule_of + e) for e in chain.expressions]
    for change in changes:
        if change.verb not in VERBS:
            raise ElementError(f"no such element verb: {change.verb}")
        named = head + names + _attr(LIST_SET, _name(change.set))
        if change.verb == "flush":
            out.append((NFT_MSG_DELSETELEM, named))
            continue
        add = change.verb == "add"
        if add and change.type.data is not None and any(v is None for _, v in change.elements):
            raise ElementError(f"an element of map {change.set} without data")
        kind = NFT_MSG_NEWSETELEM if add else NFT_MSG_DELSETELEM
        encode = _element_encoder(change.type)
        elements = [encode(k, v if add else None) for k, v in change.elements]
        if add and change.comments:
            if len(change.comments) != len(elements):
                raise ElementError(f"{change.set}: not one comment per element")
            elements = [
                _commented(e, c) if c else e
                for e, c in zip(elements, change.comments, strict=True)
            ]
        for i in range(0, len(elements), CHUNK):
            out.append((kind, named + _nest(LIST_ELEMENTS, *elements[i : i + CHUNK])))
    out += _removal_messages(head, table, tuple(removals))
    return out + [_counter_message(head, names, c) for c in counters if c.verb == "delete"]


def _removal_messages(
    head: bytes, table: str, removals: tuple[Removal, ...]
) -> list[tuple[int, bytes]]:
    """Each chain's rules (DELRULE with no handle: all of them), the chains, then the sets
    and maps, by name."""
    if any(r.kind not in ("chain", "set", "map") for r in removals):
        raise ElementError(f"no such removal kind: {[r.kind for r in removals]}")
    chains = [_name(r.name) for r in removals if r.kind == "chain"]
    named = _name(table)
    out = [
        (NFT_MSG_DELRULE, head + _attr(RULE_TABLE, named) + _attr(RULE_CHAIN, c)) for c in chains
    ]
    out += [
        (NFT_MSG_DELCHAIN, head + _attr(CHAIN_TABLE, named) + _attr(CHAIN_NAME, c)) for c in chains
    ]
    return out + [
        (NFT_MSG_DELSET, head + _attr(SET_TABLE, named) + _attr(SET_NAME, _name(r.name)))
        for r in removals
        if r.kind != "chain"
    ]


def _counter_message(head: bytes, table: bytes, change: CounterChange) -> tuple[int, bytes]:
    """NEWOBJ of a zeroed counter, or DELOBJ of one, by name."""
    body = head + table + _attr(OBJ_NAME, _name(change.name))
    body += _attr(OBJ_TYPE, struct.pack(">I", OBJECT_COUNTER))
    if change.verb == "delete":
        return NFT_MSG_DELOBJ, body
    zero = struct.pack(">Q", 0)
    return NFT_MSG_NEWOBJ, body + _nest(
        OBJ_DATA, _attr(COUNTER_BYTES, zero), _attr(COUNTER_PACKETS, zero)
    )


def _name(text: str) -> bytes:
    """A name attribute's payload: the text, NUL-terminated."""
    return text.encode() + b"\0"


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
        """Send BEGIN, ``messages``, END as one datagram; the kernel handles the batch within
        the send, so its answers are queued when it returns: an error for each refused
        message, and an ack for the last (asked for the last only: a full render's ~340
        acks would overflow the receive buffer). ElementError on a refusal."""
        if not messages:
            return
        first = self._seq + 1
        self._seq += len(messages) + 2
        batch = [_header(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, first, _batch_body())]
        for i, (kind, body) in enumerate(messages):
            flags = NLM_F_REQUEST | (NLM_F_CREATE if kind in CREATING else 0)
            flags |= NLM_F_APPEND if kind in APPENDING else 0
            flags |= NLM_F_ACK if i == len(messages) - 1 else 0
            type_ = (NFNL_SUBSYS_NFTABLES << 8) | kind
            batch.append(_header(type_, flags, first + 1 + i, body))
        batch.append(
            _header(NFNL_MSG_BATCH_END, NLM_F_REQUEST, first + len(messages) + 1, _batch_body())
        )
        data = b"".join(batch)
        self._ensure_send_buffer(len(data))
        self._sock.sendall(data)
        self._read_answers(first, len(messages))

    def _ensure_send_buffer(self, size: int) -> None:
        """A datagram larger than the socket's send buffer is refused (EMSGSIZE): a full
        render's batch is several MiB. As libnftables does, the buffer is forced (root: it
        ignores ``net.core.wmem_max``), else asked for within that limit."""
        if size + SEND_SLACK <= self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF):
            return
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, size + SEND_SLACK)
        except PermissionError:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size + SEND_SLACK)

    def _read_answers(self, first: int, count: int) -> None:
        last, answered, failed = first + count, False, []
        while True:
            try:
                data = self._sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            for seq, code in _errors(data):
                if not first <= seq <= last:
                    continue  # an earlier batch's, left when its send failed
                answered |= seq == last
                if code:
                    failed.append((seq - first - 1, code))
        if failed:  # index -1: the commit itself (answered on BEGIN's sequence number)
            index, code = min(failed)
            raise ElementError(f"{os.strerror(code)} (message {index} of the batch)")
        if not answered:
            raise ElementError(f"the batch of {count} messages was not answered")

    def close(self) -> None:
        self._sock.close()


def _batch_body() -> bytes:
    return struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(NFNL_SUBSYS_NFTABLES))


def _header(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body


def _errors(data: bytes) -> list[tuple[int, int]]:
    """(seq, errno) of each NLMSG_ERROR (errno 0: an ack) in one read."""
    return [
        (seq, -struct.unpack_from("=i", payload)[0])
        for kind, seq, payload in _messages(data)
        if kind == NLMSG_ERROR
    ]


def dump_counters(family: str, table: str) -> dict[str, tuple[int, int]]:
    """Every named counter of ``table`` as {name: (packets, bytes)}: one GETOBJ dump of the
    counters alone, answered by the kernel in a few messages. ``nft -j list counters``
    first reads every declaration of the table (~130-170 ms of CPU at 1,000 policies x
    10,000 Pods, for ~20 counters). Empty when there is no such table. ElementError on any
    other refusal; OSError from the socket."""
    body = struct.pack("=BBH", NFPROTO[family], 0, 0) + _attr(OBJ_TABLE, _name(table))
    body += _attr(OBJ_TYPE, struct.pack(">I", OBJECT_COUNTER))
    kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETOBJ
    found: dict[str, tuple[int, int]] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER) as sock:
        sock.bind((0, 0))
        sock.sendall(_header(kind, NLM_F_REQUEST | NLM_F_DUMP, 1, body))
        while True:
            data = sock.recv(1 << 20)
            for msg_type, _seq, payload in _messages(data):
                if msg_type == NLMSG_DONE:
                    return found
                if msg_type == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", payload)[0]
                    if code == errno.ENOENT:
                        return {}
                    raise ElementError(f"counters of {table}: {os.strerror(code)}")
                if msg_type == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWOBJ:
                    name, counts = _counter_of(payload[4:])  # after the nfgenmsg
                    if name is not None:
                        found[name] = counts


def _messages(data: bytes) -> list[tuple[int, int, bytes]]:
    """(type, seq, payload) of each netlink message in one read."""
    out, offset = [], 0
    while offset + 16 <= len(data):
        length, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", data, offset)
        out.append((kind, seq, data[offset + 16 : offset + max(length, 16)]))
        offset += max((length + 3) & ~3, 16)
    return out


def _attrs(data: bytes) -> dict[int, bytes]:
    """Attribute type (nesting flag cleared) -> payload, of one attribute list."""
    out, offset = {}, 0
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        out[kind & ~NLA_F_NESTED] = data[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    return out


def _counter_of(data: bytes) -> tuple[str | None, tuple[int, int]]:
    """A NEWOBJ's name and (packets, bytes); None for another object type."""
    attrs = _attrs(data)
    if struct.unpack(">I", attrs.get(OBJ_TYPE, b"\0\0\0\0"))[0] != OBJECT_COUNTER:
        return None, (0, 0)
    counts = _attrs(attrs.get(OBJ_DATA, b""))
    packets = struct.unpack(">Q", counts[COUNTER_PACKETS])[0] if COUNTER_PACKETS in counts else 0
    octets = struct.unpack(">Q", counts[COUNTER_BYTES])[0] if COUNTER_BYTES in counts else 0
    return attrs.get(OBJ_NAME, b"").rstrip(b"\0").decode(), (packets, octets)
