"""A rule's netlink expressions, for the few rule shapes NetworkPolicy's shape chains are
made of (``netpol/render.py``), so that a new chain can go in the element batch
(``kernel/nftelem.py`` ``NewChain``) instead of a libnftables script, which first re-reads
the table's declarations (~1.2 ms of a relabel's pass at 1,000 policies).

A rule is nft text; the expressions are the ones nft 1.0.6 writes for the same text
(``nft --debug=netlink``), so the kernel lists both alike (tests/netns/test_nft_rules.py):

    ip saddr @S … / ip6 daddr @S …   meta nfproto (once per rule), payload, lookup
    meta l4proto . th dport @S       meta l4proto, byteorder (the set is an interval
                                     concatenation), payload th dport, lookup
    ip daddr . meta l4proto . th dport @S   payload, meta l4proto, payload, lookup
    counter name ip daddr map @M     meta nfproto, payload, objref
    counter                          a counter from zero
    return | drop | accept           the verdict

Any other rule: ``encode_rule`` returns None, and the caller keeps nft's script.
"""

from __future__ import annotations

import re
import struct

from kernel.nftelem import RULE_EXPRESSIONS, VERDICTS, _attr, _name, _nest

LIST_ELEM, EXPR_NAME, EXPR_DATA = 1, 1, 2
META_DREG, META_KEY, META_NFPROTO, META_L4PROTO = 1, 2, 15, 16
CMP_SREG, CMP_OP, CMP_DATA, CMP_EQ, DATA_VALUE = 1, 2, 3, 0, 1
PAYLOAD_DREG, PAYLOAD_BASE, PAYLOAD_OFFSET, PAYLOAD_LEN = 1, 2, 3, 4
NETWORK_HEADER, TRANSPORT_HEADER = 1, 2
LOOKUP_SET, LOOKUP_SREG = 1, 2
BYTEORDER_SREG, BYTEORDER_DREG, BYTEORDER_OP, BYTEORDER_LEN, BYTEORDER_SIZE = 1, 2, 3, 4, 5
HTON = 1
OBJREF_SET_SREG, OBJREF_SET_NAME = 3, 4
IMMEDIATE_DREG, IMMEDIATE_DATA, DATA_VERDICT, VERDICT_CODE = 1, 2, 2, 1
COUNTER_BYTES, COUNTER_PACKETS = 1, 2
#: per family: its nfproto, and the address's (offset of saddr, of daddr, length)
FAMILIES = {"ip": (2, 12, 16, 4), "ip6": (10, 8, 24, 16)}
#: the registers nft gives the fields after an address in a concatenation (reg 1 holds it)
CONCAT_REGS = {"ip": (9, 10), "ip6": (2, 13)}
NAME = r"[A-Za-z0-9_./-]+"
ADDRESS = re.compile(rf"^(ip6?) (saddr|daddr) @({NAME})$")
PORTS = re.compile(rf"^meta l4proto \. th dport @({NAME})$")
NAMED = re.compile(rf"^(ip6?) daddr \. meta l4proto \. th dport @({NAME})$")
OBJREF = re.compile(rf"^counter name (ip6?) (saddr|daddr) map @({NAME})$")
TERM = re.compile(
    rf"(?:ip6? (?:saddr|daddr) \. meta l4proto \. th dport @{NAME}"
    rf"|ip6? (?:saddr|daddr) @{NAME}|meta l4proto \. th dport @{NAME})"
)


def _u32(value: int) -> bytes:
    return struct.pack(">I", value)


def _expr(name: str, *attrs: bytes) -> bytes:
    return _nest(LIST_ELEM, _attr(EXPR_NAME, _name(name)), _nest(EXPR_DATA, *attrs))


def _meta(key: int, dreg: int) -> bytes:
    return _expr("meta", _attr(META_DREG, _u32(dreg)), _attr(META_KEY, _u32(key)))


def _nfproto(family: str) -> list[bytes]:
    value = bytes([FAMILIES[family][0]])
    return [
        _meta(META_NFPROTO, 1),
        _expr(
            "cmp",
            _attr(CMP_SREG, _u32(1)),
            _attr(CMP_OP, _u32(CMP_EQ)),
            _nest(CMP_DATA, _attr(DATA_VALUE, value)),
        ),
    ]


def _payload(base: int, offset: int, length: int, dreg: int) -> bytes:
    return _expr(
        "payload",
        _attr(PAYLOAD_DREG, _u32(dreg)),
        _attr(PAYLOAD_BASE, _u32(base)),
        _attr(PAYLOAD_OFFSET, _u32(offset)),
        _attr(PAYLOAD_LEN, _u32(length)),
    )


def _address(family: str, which: str) -> bytes:
    _proto, saddr, daddr, length = FAMILIES[family]
    return _payload(NETWORK_HEADER, saddr if which == "saddr" else daddr, length, 1)


def _lookup(name: str) -> bytes:
    return _expr("lookup", _attr(LOOKUP_SET, _name(name)), _attr(LOOKUP_SREG, _u32(1)))


def _verdict(word: str) -> bytes:
    code = _attr(VERDICT_CODE, struct.pack(">i", VERDICTS[word]))
    data = _nest(IMMEDIATE_DATA, _nest(DATA_VERDICT, code))
    return _expr("immediate", _attr(IMMEDIATE_DREG, _u32(0)), data)


def _counter() -> bytes:
    zero = struct.pack(">Q", 0)
    return _expr("counter", _attr(COUNTER_BYTES, zero), _attr(COUNTER_PACKETS, zero))


def encode_rule(rule: str) -> bytes | None:
    """``rule``'s NFTA_RULE_EXPRESSIONS attribute; None for a rule outside the shapes above."""
    words = rule.split()
    if not words or words[-1] not in ("return", "drop", "accept"):
        return _encode_objref(rule)
    body, verdict = " ".join(words[:-1]), words[-1]
    if body == "counter":
        return _nest(RULE_EXPRESSIONS, _counter(), _verdict(verdict))
    terms = TERM.findall(body)
    if " ".join(terms) != body:
        return None
    out: list[bytes] = []
    checked: set[str] = set()  # the families whose nfproto the rule checked already
    for term in terms:
        parts = _encode_term(term, checked)
        if parts is None:
            return None
        out += parts
    return _nest(RULE_EXPRESSIONS, *out, _verdict(verdict))


def _nfproto_once(family: str, checked: set[str]) -> list[bytes]:
    """The family's check, unless the rule made it already (nft writes it once)."""
    if family in checked:
        return []
    checked.add(family)
    return _nfproto(family)


def _encode_term(term: str, checked: set[str]) -> list[bytes] | None:
    if found := ADDRESS.match(term):
        family, which, name = found.groups()
        return [*_nfproto_once(family, checked), _address(family, which), _lookup(name)]
    if found := PORTS.match(term):
        order = _expr(
            "byteorder",
            _attr(BYTEORDER_SREG, _u32(1)),
            _attr(BYTEORDER_DREG, _u32(1)),
            _attr(BYTEORDER_OP, _u32(HTON)),
            _attr(BYTEORDER_LEN, _u32(1)),
            _attr(BYTEORDER_SIZE, _u32(2)),
        )
        dport = _payload(TRANSPORT_HEADER, 2, 2, 9)
        return [_meta(META_L4PROTO, 1), order, dport, _lookup(found.group(1))]
    if found := NAMED.match(term):
        family, name = found.groups()
        proto_reg, port_reg = CONCAT_REGS[family]
        return [
            *_nfproto_once(family, checked),
            _address(family, "daddr"),
            _meta(META_L4PROTO, proto_reg),
            _payload(TRANSPORT_HEADER, 2, 2, port_reg),
            _lookup(name),
        ]
    return None


def _encode_objref(rule: str) -> bytes | None:
    found = OBJREF.match(rule)
    if found is None:
        return None
    family, which, name = found.groups()
    ref = _expr("objref", _attr(OBJREF_SET_SREG, _u32(1)), _attr(OBJREF_SET_NAME, _name(name)))
    return _nest(RULE_EXPRESSIONS, *_nfproto(family), _address(family, which), ref)
