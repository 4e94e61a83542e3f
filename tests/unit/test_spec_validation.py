"""What pycnid reads from a request is checked for type and range before it is used: deep
nesting, non-finite numbers, lone surrogates, a missing `type`, and malformed prevResults are
each a spec error naming the field, never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni.spec.errors import CNIError
from cni.spec.request import MAX_DEPTH, gc_valid_attachments, ipam_type, key_path, parse_config
from cni.spec.result import canonical
from cni.spec.versions import parse_version

VERBS = ("ADD", "DEL", "CHECK", "STATUS", "GC")
BASE = {"cniVersion": "1.1.0", "name": "podnet", "type": "pycni-bridge"}


def error_of(fn, *args, **kw) -> CNIError:
    with pytest.raises(CNIError) as info:
        fn(*args, **kw)
    return info.value


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


@pytest.mark.parametrize("verb", VERBS + ("VERSION",))
@pytest.mark.parametrize("depth", [MAX_DEPTH, 1000, 100_000])
def test_too_deep_a_config_is_code_6_on_every_verb(verb, depth) -> None:
    data = json.dumps(BASE)[:-1] + ', "args": ' + nested(depth) + "}"
    for form in (data, data.encode()):
        err = error_of(parse_config, form, verb)
        assert err.code == 6 and f"deeper than {MAX_DEPTH}" in str(err)


def test_nesting_below_the_limit_is_accepted() -> None:
    data = json.dumps(BASE)[:-1] + ', "args": ' + nested(MAX_DEPTH - 2) + "}"
    assert parse_config(data, "ADD")["name"] == "podnet"


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"])
def test_numbers_json_cannot_hold_are_code_6(number) -> None:
    data = json.dumps(BASE)[:-1] + f', "mtu": {number}' + "}"
    err = error_of(parse_config, data, "ADD")
    assert err.code == 6 and "decode" in err.msg


@pytest.mark.parametrize(
    "doc,named",
    [
        ({**BASE, "bridge": "\ud800"}, "bridge"),
        (
            {**BASE, "cni.dev/valid-attachments": [{"containerID": "\udfff", "ifname": "eth0"}]},
            "cni.dev/valid-attachments[0].containerID",
        ),
        (
            {**BASE, "ipam": {"type": "pycni-ipam", "routes": [{"dst": "x\ud800"}]}},
            "ipam.routes[0].dst",
        ),
        ({**BASE, "args": {"\ud800": 1}}, "args.\ud800"),
    ],
)
def test_a_lone_surrogate_is_code_7_naming_the_key(doc, named) -> None:
    err = error_of(parse_config, json.dumps(doc), "GC")
    assert err.code == 7 and err.msg == f"invalid {named}" and "Unicode" in err.details


@pytest.mark.parametrize(
    "data",
    [
        b'{"cniVersion": "1.1.0", "name": "n", "type": "x", "bridge": "\xed\xa0\x80"}',
        '{"cniVersion": "1.1.0", "name": "n", "type": "x", "bridge": "\\ud800"}'.encode("utf-16"),
        '{"cniVersion": "1.1.0", "name": "n", "type": "x", "bridge": "\\ud800"}',
    ],
)
def test_a_surrogate_however_encoded_is_code_7(data) -> None:
    """json decodes bytes with 'surrogatepass': an encoded surrogate and one in UTF-16 text
    are found as well as an escaped one."""
    err = error_of(parse_config, data, "ADD")
    assert err.code == 7 and err.msg == "invalid bridge"


def test_a_config_with_many_brackets_in_strings_is_still_accepted() -> None:
    doc = {**BASE, "args": {"note": "[" * 500}}
    assert parse_config(json.dumps(doc).encode(), "ADD")["args"]["note"] == "[" * 500


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("kind", [None, "", 5, ["pycni-bridge"]])
def test_type_is_required_on_every_verb_but_version(verb, kind) -> None:
    doc = {k: v for k, v in BASE.items() if k != "type"}
    if kind is not None:
        doc["type"] = kind
    err = error_of(parse_config, json.dumps(doc), verb)
    assert err.code == 7 and "'type'" in err.msg
    assert parse_config(json.dumps(doc), "VERSION")["cniVersion"] == "1.1.0"


@pytest.mark.parametrize(
    "ipam,required,named",
    [
        (0, False, "invalid key 'ipam'"),
        ({"type": "a/b"}, False, "invalid key 'ipam.type'"),
        ({"type": "a\u0000b"}, False, "invalid key 'ipam.type'"),
        ({"type": ".."}, False, "invalid key 'ipam.type'"),
        ({"type": 3}, False, "invalid key 'ipam.type'"),
        ({"subnet": "10.0.0.0/24"}, False, "missing key 'ipam.type'"),
        (None, True, "missing key 'ipam'"),
        ({}, True, "missing key 'ipam.type'"),
    ],
)
def test_ipam_type_names_the_problem(ipam, required, named) -> None:
    doc = {**BASE} if ipam is None else {**BASE, "ipam": ipam}
    err = error_of(ipam_type, doc, required=required)
    assert err.code == 7 and err.msg == named


def test_no_ipam_section_is_no_delegation() -> None:
    assert ipam_type(BASE) is None and ipam_type({**BASE, "ipam": {}}) is None
    assert ipam_type({**BASE, "ipam": {"type": "host-local"}}) == "host-local"


@pytest.mark.parametrize(
    "entry,named",
    [
        ({"containerID": 5, "ifname": "eth0"}, "[1].containerID"),
        ({"containerID": "-x", "ifname": "eth0"}, "[1].containerID"),
        ({"containerID": "c2", "ifname": 0}, "[1].ifname"),
        ({"containerID": "c2", "ifname": "x" * 16}, "[1].ifname"),
    ],
)
def test_gc_attachments_are_typed(entry, named) -> None:
    conf = {"cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}, entry]}
    err = error_of(gc_valid_attachments, conf)
    assert err.code == 7 and err.msg == f"invalid cni.dev/valid-attachments{named}"


def test_key_path_reads_as_the_document() -> None:
    assert key_path(("ipam", "ranges", 0, 1, "subnet")) == "ipam.ranges[0][1].subnet"


@pytest.mark.parametrize("text", ["1.0.²", "1.0.٣", "1.0." + "9" * 5000])
def test_versions_with_unusual_digits_are_code_6(text) -> None:
    assert error_of(parse_version, text).code == 6


GOOD_PREV = {
    "cniVersion": "1.1.0",
    "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:03", "sandbox": "/x"}],
    "ips": [{"address": "10.22.0.5/24", "gateway": "10.22.0.1", "interface": 0}],
    "routes": [{"dst": "0.0.0.0/0"}],
    "dns": {},
}


def with_(part: str, value) -> dict:
    prev = json.loads(json.dumps(GOOD_PREV))
    key, _, field = part.partition(".")
    if field:
        prev[key][0][field] = value
    else:
        prev[key] = value
    return prev


@pytest.mark.parametrize(
    "prev,named",
    [
        ({**GOOD_PREV, "routes": [{"gw": "10.22.0.1"}]}, "prevResult.routes[0].dst"),
        (with_("routes.dst", 5), "prevResult.routes[0].dst"),
        (with_("routes.dst", float("nan")), "prevResult.routes[0].dst"),
        (with_("routes.dst", "10.0.0.0/33"), "prevResult.routes[0].dst"),
        (with_("routes.gw", 7), "prevResult.routes[0].gw"),
        (with_("routes.gw", float("nan")), "prevResult.routes[0].gw"),
        (with_("routes.gw", "fd00::1"), "prevResult.routes[0].gw"),
        (with_("routes.table", 2**32), "prevResult.routes[0].table"),
        (with_("routes.priority", -1), "prevResult.routes[0].priority"),
        (with_("routes.mtu", 1.5), "prevResult.routes[0].mtu"),
        (with_("routes.advmss", True), "prevResult.routes[0].advmss"),
        (with_("routes.scope", 256), "prevResult.routes[0].scope"),
        (with_("interfaces.mac", 5), "prevResult.interfaces[0].mac"),
        (with_("interfaces.name", ["eth0"]), "prevResult.interfaces[0].name"),
        (with_("interfaces.mtu", 2**32), "prevResult.interfaces[0].mtu"),
        (with_("ips.interface", float("inf")), "prevResult.ips[0].interface"),
        (with_("ips.interface", 1), "prevResult.ips[0].interface"),
        (with_("ips.interface", "0"), "prevResult.ips[0].interface"),
        (with_("ips.address", 167772165), "prevResult.ips[0].address"),
        (with_("ips.gateway", "fd00::1"), "prevResult.ips[0].gateway"),
        (with_("ips", {"address": "10.0.0.1/24"}), "prevResult.ips"),
        (with_("routes", ["0.0.0.0/0"]), "prevResult.routes[0]"),
        (with_("dns", {"nameservers": "10.0.0.1"}), "prevResult.dns.nameservers"),
        (with_("dns", {"domain": 5}), "prevResult.dns.domain"),
        (with_("dns", []), "prevResult.dns"),
        (with_("cniVersion", 1.0), "prevResult.cniVersion"),
    ],
)
def test_a_malformed_prev_result_is_code_6_naming_the_field(prev, named) -> None:
    err = error_of(canonical, prev, "1.1.0")
    assert err.code == 6 and err.msg == f"invalid {named}", str(err)


def test_where_names_the_document() -> None:
    err = error_of(canonical, with_("routes.dst", 5), where="result of IPAM plugin x")
    assert err.msg == "invalid result of IPAM plugin x.routes[0].dst"


def test_a_well_formed_prev_result_keeps_its_fields() -> None:
    prev = with_(
        "routes",
        [{"dst": "10.0.0.0/8", "gw": "10.22.0.9", "table": 2**32 - 1, "scope": 253, "mtu": 0}],
    )
    assert canonical(prev)["routes"] == prev["routes"]
    assert canonical(GOOD_PREV)["ips"] == GOOD_PREV["ips"]


# Generated inputs: whatever the document, a parsed value or a CNIError with a spec code.
SPEC_CODES = {1, 2, 3, 4, 5, 6, 7, 11, 50, 51} | set(range(100, 200))
SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20)
)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)
PREV_KEYS = st.sampled_from(
    [
        "cniVersion",
        "interfaces",
        "ips",
        "routes",
        "dns",
        "name",
        "mac",
        "mtu",
        "sandbox",
        "address",
        "gateway",
        "interface",
        "dst",
        "gw",
        "table",
        "scope",
        "priority",
        "nameservers",
        "domain",
    ]
)
PREVISH = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(PREV_KEYS, inner, max_size=5),
    max_leaves=40,
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_spec_error(fn, *args, **kw) -> None:
    try:
        fn(*args, **kw)
    except CNIError as err:
        assert err.code in SPEC_CODES and err.msg


@FUZZ
@given(st.binary(max_size=200), st.sampled_from(VERBS + ("VERSION",)))
def test_parse_config_of_any_bytes(data, verb) -> None:
    assert_spec_error(parse_config, data, verb)


@FUZZ
@given(JSONISH, st.sampled_from(VERBS))
def test_parse_config_of_any_document(extra, verb) -> None:
    doc = {**BASE, "extra": extra} if not isinstance(extra, dict) else {**BASE, **extra}
    assert_spec_error(parse_config, json.dumps(doc), verb)


@FUZZ
@given(PREVISH)
def test_canonical_of_any_document(prev) -> None:
    assert_spec_error(canonical, prev, "1.1.0")


@FUZZ
@given(st.lists(PREVISH, max_size=3), st.lists(PREVISH, max_size=3), st.lists(PREVISH, max_size=3))
def test_canonical_of_result_shaped_documents(interfaces, ips, routes) -> None:
    assert_spec_error(canonical, {"interfaces": interfaces, "ips": ips, "routes": routes})
