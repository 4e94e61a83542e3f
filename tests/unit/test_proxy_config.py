"""The proxy's kube-proxy settings (nodePortAddresses, masqueradeAll, detectLocalMode): parsed
once into typed config or refused with code 7 naming the key (generated input), and what each
does to the node's view and the rendered ``services`` chain."""

from __future__ import annotations

import ipaddress

from hypothesis import example, given
from hypothesis import strategies as st

from cni.spec.errors import InvalidConfig
from nodes.record import NodeRecord
from services.proxy.config import parse_proxy_config
from services.proxy.render import render_skeleton
from services.proxy.view import Records, calc_node_view

KEYS = ("nodePortAddresses", "masqueradeAll", "detectLocalMode", "detectLocal")
VALUES = (
    st.none()
    | st.booleans()
    | st.integers(-2, 2)
    | st.sampled_from(["ClusterCIDR", "BridgeInterface", "primary", "cni", "x y", ""])
    | st.lists(
        st.sampled_from(["primary", "10.0.0.0/8", "fd00::/64", "10.0.0.1/8", "nope", ""]),
        max_size=3,
    )
    | st.dictionaries(
        st.sampled_from(["bridgeInterface", "other"]),
        st.sampled_from(["cni0", "pycni", "a" * 16, 'b"r', "", 3]),
        max_size=2,
    )
)


@given(st.dictionaries(st.sampled_from(KEYS), VALUES))
@example({"detectLocalMode": "BridgeInterface"})
def test_kube_proxy_settings_are_typed_config_or_code_7_naming_the_key(settings):
    section = {"proxy": True, **{k: v for k, v in settings.items() if v is not None}}
    try:
        config = parse_proxy_config({"services": section})
    except InvalidConfig as exc:
        named = str(exc).split("'services.", 1)[1].split("'")[0]
        assert exc.code == 7 and named.split(".")[0] in KEYS, str(exc)
        return
    assert config is not None
    addresses = section.get("nodePortAddresses")
    assert config.node_port_primary == (addresses == ["primary"])
    if config.node_port_cidrs is not None:
        assert [str(n) for n in config.node_port_cidrs] == addresses
    assert config.masquerade_all is section.get("masqueradeAll", False)
    bridge = config.local_bridge
    assert (bridge is not None) == (section.get("detectLocalMode") == "BridgeInterface")
    if bridge is not None:
        assert bridge == section["detectLocal"]["bridgeInterface"] and '"' not in bridge


def view_under(section: dict, family: int = 4):
    records = Records()
    records.nodes["n1"] = NodeRecord("n1", "192.168.0.2")
    records.pools["p"] = "10.0.0.0/16"
    config = parse_proxy_config({"services": {"proxy": True, **section}})
    local = ["192.168.0.2/24", "198.51.100.2/24", "10.0.0.1/24", "fd01::2/64"]
    return calc_node_view(records, "n1", family, local, config)


def test_node_port_addresses_default_primary_and_cidrs():
    ips = lambda view: {str(ip) for ip in view.node_ips}  # noqa: E731
    assert ips(view_under({})) == {"192.168.0.2", "198.51.100.2"}  # every global address
    assert ips(view_under({"nodePortAddresses": ["primary"]})) == {"192.168.0.2"}
    assert ips(view_under({"nodePortAddresses": ["198.51.100.0/24"]})) == {"198.51.100.2"}
    assert ips(view_under({"nodePortAddresses": ["fd01::/64"]}, 6)) == {"fd01::2"}
    assert ips(view_under({"nodePortAddresses": ["primary"]}, 6)) == set()  # an IPv4 record
    assert ipaddress.ip_address("10.0.0.1") not in view_under({}).node_ips  # a pool's: never


RULE = "add rule ip pycni-svc services ip daddr"


def test_the_clusterip_masquerade_rule_follows_the_local_detection():
    def rule(section: dict) -> str:
        lines = render_skeleton(4, view_under(section)).splitlines()
        return next(r for r in lines if r.startswith(f"{RULE} @service-vips "))

    assert "ip saddr != @cluster-cidrs meta mark set" in rule({})
    assert 'iifname != "cni*" meta mark set' in rule(
        {"detectLocalMode": "BridgeInterface", "detectLocal": {"bridgeInterface": "cni"}}
    )
    assert rule({"masqueradeAll": True}).endswith(
        "services ip daddr @service-vips meta mark set meta mark | 0x4000"
    )
