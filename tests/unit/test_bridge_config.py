"""pycni-bridge config parsing: defaults, every key validated with its name in the error."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.spec.errors import CNIError, InvalidConfig, UnsupportedField
from cni.spec.request import Env, Request
from plugins.bridge.config import DEFAULT_BRIDGE, parse_bridge_config


def request(cni_args: dict | None = None, **conf) -> Request:
    config = {"cniVersion": "1.1.0", "name": "podnet", "type": "pycni-bridge", **conf}
    return Request(
        env=Env(command="ADD", container_id="c1", netns="/x", ifname="eth0", args=cni_args or {}),
        config=config,
    )


def test_defaults():
    cfg = parse_bridge_config(request())
    assert cfg.bridge == DEFAULT_BRIDGE == "pycni0"
    assert not (cfg.is_gateway or cfg.ip_masq or cfg.hairpin or cfg.promisc or cfg.force_address)
    assert cfg.mtu is None and cfg.mac is None and cfg.dns == {} and not cfg.has_ipam


def test_default_gateway_implies_gateway():
    cfg = parse_bridge_config(request(isDefaultGateway=True))
    assert cfg.is_gateway and cfg.is_default_gateway


def test_unknown_keys_are_ignored():
    assert parse_bridge_config(request(somethingElse={"x": 1}, ipMasqBackend="nftables"))


@pytest.mark.parametrize(
    "key,value",
    [("isGateway", "yes"), ("ipMasq", 1), ("hairpinMode", "true"), ("forceAddress", [])],
)
def test_non_bool_flags_are_rejected_by_name(key, value):
    with pytest.raises(InvalidConfig) as err:
        parse_bridge_config(request(**{key: value}))
    assert err.value.code == 7 and key in err.value.msg


def test_hairpin_and_promisc_are_mutually_exclusive():
    with pytest.raises(InvalidConfig) as err:
        parse_bridge_config(request(hairpinMode=True, promiscMode=True))
    assert "hairpinMode" in err.value.msg and "promiscMode" in err.value.msg


@pytest.mark.parametrize("value", [67, 65536, "1500", 1.5, True, -1])
def test_bad_mtu(value):
    with pytest.raises(InvalidConfig, match="'mtu'"):
        parse_bridge_config(request(mtu=value))


def test_mtu_zero_means_unset():
    assert parse_bridge_config(request(mtu=0)).mtu is None
    assert parse_bridge_config(request(mtu=9000)).mtu == 9000


@pytest.mark.parametrize("name", ["", "x" * 16, "a/b", "a b", "a:b", ".", 7])
def test_bad_bridge_names(name):
    with pytest.raises(InvalidConfig, match="'bridge'"):
        parse_bridge_config(request(bridge=name))


def test_mac_precedence_runtime_config_then_args_then_cni_args():
    cni_args = {"MAC": "02:00:00:00:00:03"}
    every = request(
        cni_args,
        runtimeConfig={"mac": "02:00:00:00:00:01"},
        args={"cni": {"mac": "02:00:00:00:00:02"}},
    )
    assert parse_bridge_config(every).mac == "02:00:00:00:00:01"
    no_runtime = request(cni_args, args={"cni": {"mac": "02-00-00-00-00-02"}})
    assert parse_bridge_config(no_runtime).mac == "02:00:00:00:00:02"
    assert parse_bridge_config(request(cni_args)).mac == "02:00:00:00:00:03"


@pytest.mark.parametrize(
    "mac", ["zz:00:00:00:00:01", "01:00:5e:00:00:01", "00:00:00:00:00:00", "02:00"]
)
def test_bad_mac_names_its_source(mac):
    with pytest.raises(InvalidConfig, match="runtimeConfig.mac"):
        parse_bridge_config(request(runtimeConfig={"mac": mac}))
    with pytest.raises(InvalidConfig, match="CNI_ARGS MAC"):
        parse_bridge_config(request({"MAC": mac}))


def test_dns_is_validated_and_kept():
    cfg = parse_bridge_config(request(dns={"nameservers": ["10.0.0.10"], "domain": "cluster"}))
    assert cfg.dns == {"nameservers": ["10.0.0.10"], "domain": "cluster"}
    with pytest.raises(InvalidConfig, match="dns.nameservers"):
        parse_bridge_config(request(dns={"nameservers": "10.0.0.10"}))
    with pytest.raises(InvalidConfig, match="'dns'"):
        parse_bridge_config(request(dns=["10.0.0.10"]))


@pytest.mark.parametrize(
    "key,value", [("vlan", 100), ("macspoofchk", True), ("vlanTrunk", [{"id": 5}])]
)
def test_unimplemented_reference_features_are_refused_when_on(key, value):
    with pytest.raises(UnsupportedField) as err:
        parse_bridge_config(request(**{key: value}))
    assert err.value.code == 2 and key in err.value.msg
    assert parse_bridge_config(request(**{key: type(value)()}))


def test_iptables_backend_is_refused():
    with pytest.raises(InvalidConfig, match="ipMasqBackend"):
        parse_bridge_config(request(ipMasqBackend="iptables"))


@pytest.mark.parametrize(
    "name", ["a\u0000b", "br\u0007", "\ud800", "ü" * 8, "a\u2028b", "a\u00a0b"]
)
def test_bridge_names_the_kernel_would_cut_or_refuse(name):
    """NUL and control characters, lone surrogates, more than 15 bytes of UTF-8."""
    with pytest.raises(InvalidConfig, match="'bridge'") as err:
        parse_bridge_config(request(bridge=name))
    assert err.value.code == 7


@pytest.mark.parametrize("name", ['a"b', "a\\b", "br*"])
def test_a_bridge_name_nft_cannot_match_is_refused_at_parse_time_with_ipmasq(name):
    """Refused before ADD makes the bridge (a bridge is never undone), not at the masquerade
    step; without ipMasq nft never sees the name and the kernel takes it."""
    with pytest.raises(InvalidConfig, match="'bridge'") as err:
        parse_bridge_config(request(bridge=name, ipMasq=True))
    assert err.value.code == 7 and "nftables" in err.value.details
    assert parse_bridge_config(request(bridge=name)).bridge == name


def test_a_bridge_name_of_15_utf8_bytes_is_accepted():
    assert parse_bridge_config(request(bridge="ü" * 7 + "x")).bridge == "ü" * 7 + "x"


GENERATED = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.lists(st.text(max_size=5), max_size=3)
    | st.dictionaries(
        st.sampled_from(["nameservers", "domain", "search"]),
        st.text(max_size=5) | st.lists(st.integers(), max_size=2),
    )
)
BRIDGE_KEYS = st.sampled_from(
    [
        "bridge",
        "isGateway",
        "isDefaultGateway",
        "forceAddress",
        "ipMasq",
        "hairpinMode",
        "promiscMode",
        "mtu",
        "dns",
        "ipMasqBackend",
        "vlan",
        "macspoofchk",
        "runtimeConfig",
        "args",
        "ipam",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        BRIDGE_KEYS,
        GENERATED | st.dictionaries(st.sampled_from(["mac", "cni"]), GENERATED),
        max_size=6,
    ),
    st.text(max_size=20),
)
def test_any_bridge_config_parses_or_is_a_spec_error(conf, cni_mac):
    try:
        cfg = parse_bridge_config(request({"MAC": cni_mac}, **conf))
    except CNIError as err:
        assert err.code in (2, 7) and err.msg
    else:
        assert isinstance(cfg.bridge, str) and len(cfg.bridge.encode()) <= 15
