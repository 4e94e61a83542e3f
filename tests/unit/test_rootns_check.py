"""The root-namespace check (tests/fixtures/rootns.py) on fabricated ``ip -j``/``nft -j`` output:
it names planted changes and ignores what the kernel or traffic change by themselves. Nothing
here reads or changes the machine."""

from __future__ import annotations

from tests.fixtures.rootns import (
    ROUTE_KEYS,
    calc_addresses,
    calc_differences,
    calc_links,
    calc_nft,
    calc_routes,
    calc_sysctls,
)


def keep(_name: str) -> bool:
    return False


def link(name: str, flags: list[str], kind: str | None = None, **extra) -> dict:
    info = {"linkinfo": {"info_kind": kind}} if kind else {}
    return {
        "ifname": name,
        "flags": flags,
        "mtu": 1500,
        "address": "02:00:00:00:00:01",
        "operstate": "UP",
        **info,
        **extra,
    }


def nft(*entries: dict) -> dict:
    return {"nftables": [{"metainfo": {"version": "1.0.6"}}, *entries]}


def test_a_planted_veth_route_rule_and_sysctl_are_each_named():
    before = {
        "links": calc_links([link("eth0", ["UP"])], keep),
        "routes": calc_routes(
            [{"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"}], ROUTE_KEYS, "4"
        ),
        "sysctls": calc_sysctls({"net/ipv4/ip_forward": "0"}.get, []),
    }
    after = {
        "links": calc_links(
            [link("eth0", ["UP"]), link("veth1a2b3c", ["UP"], kind="veth", master="pycni0")], keep
        ),
        "routes": calc_routes(
            [
                {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
                {"dst": "10.22.0.0/16", "dev": "pycni0", "table": "100"},
            ],
            ROUTE_KEYS,
            "4",
        ),
        "sysctls": calc_sysctls({"net/ipv4/ip_forward": "1"}.get, []),
    }
    found = calc_differences(before, after)
    assert len(found) == 4, found
    assert any(f.startswith("links: + ") and "veth1a2b3c" in f for f in found)
    assert any(f.startswith("routes: + ") and '"table": "100"' in f for f in found)
    assert any(f.startswith("sysctls: - ") and '"value": "0"' in f for f in found)
    assert any(f.startswith("sysctls: + ") and '"value": "1"' in f for f in found)


def test_carrier_and_operstate_are_not_changes_but_admin_state_is():
    before = calc_links([link("eth0", ["UP", "LOWER_UP"])], keep)
    assert calc_links([link("eth0", ["UP", "NO-CARRIER"], operstate="DOWN")], keep) == before
    assert calc_links([link("eth0", [])], keep) != before


def test_dynamic_addresses_are_left_out_static_ones_counted():
    def addrs(*infos: dict) -> frozenset[str]:
        return calc_addresses([{"ifname": "eth0", "addr_info": list(infos)}], keep)

    static = {"local": "192.0.2.2", "prefixlen": 24, "scope": "global", "valid_life_time": 1}
    slaac = {"local": "2001:db8::5", "prefixlen": 64, "dynamic": True}
    assert addrs(static, slaac) == addrs({**static, "valid_life_time": 99})
    assert calc_differences(
        {"a": addrs(static)}, {"a": addrs(static, {**static, "local": "10.1.1.1"})}
    )


def test_nft_counters_and_foreign_set_elements_are_not_changes_pycni_elements_are():
    def ruleset(packets: int, foreign: list, own: list) -> frozenset[str]:
        return calc_nft(
            nft(
                {"table": {"family": "inet", "name": "fw", "handle": 1}},
                {
                    "rule": {
                        "family": "inet",
                        "table": "fw",
                        "chain": "in",
                        "handle": 7,
                        "expr": [
                            {"counter": {"packets": packets, "bytes": packets * 60}},
                            {"accept": None},
                        ],
                    }
                },
                {
                    "set": {
                        "family": "inet",
                        "table": "fw",
                        "name": "seen",
                        "type": "ipv4_addr",
                        "handle": 3,
                        "elem": foreign,
                    }
                },
                {
                    "set": {
                        "family": "ip",
                        "table": "pycni-masq",
                        "name": "sources",
                        "type": "ipv4_addr",
                        "handle": 4,
                        "elem": own,
                    }
                },
            )
        )

    base = ruleset(1, ["10.0.0.1"], [])
    assert ruleset(500, ["10.0.0.9", "10.0.0.8"], []) == base
    found = calc_differences({"nft": base}, {"nft": ruleset(1, ["10.0.0.1"], ["10.22.0.5"])})
    assert len(found) == 2 and all("pycni-masq" in f for f in found)
    table = calc_nft(nft({"table": {"family": "inet", "name": "pycni-svc", "handle": 9}}))
    assert calc_differences({"nft": base}, {"nft": base | table}) == [
        'nft: + nft-table {"family": "inet", "name": "pycni-svc"}'
    ]


def test_identical_snapshots_have_no_differences():
    snap = {"sysctls": calc_sysctls({"net/ipv4/ip_forward": "1"}.get, ["eth0"])}
    assert calc_differences(snap, dict(snap)) == []
