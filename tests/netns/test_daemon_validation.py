"""A real pycnid answers bad input with the spec code and a message naming the field, logs no
stack for it, changes nothing on the node and keeps serving."""

from __future__ import annotations

import array
import json
import socket

import pytest

from cni.spec import wire
from tests.fixtures.bridge import (
    BridgeNode,
    bridge_conf,
    container_links,
    new_cid,
    pycni_ipam,
)
from tests.fixtures.plugins import run_plugin

pytestmark = pytest.mark.netns
VERBS = ("ADD", "CHECK", "DEL", "GC", "STATUS")


def ask(
    bn: BridgeNode, plugin: str, command: str, stdin: bytes, cid: str = "c1", fd: int | None = None
) -> tuple[int, dict]:
    """One raw request to pycnid, as the executable frames it (so nothing else can fail)."""
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_IFNAME": "eth0",
        "CNI_NETNS": "/x" if command != "DEL" else "",
        "CNI_PATH": bn.cni_path,
    }
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(bn.socket)
        rights = (
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())]
            if fd is not None
            else []
        )
        sock.sendmsg([wire.encode_request(plugin, env, stdin, fd is not None)], rights)
        sock.shutdown(socket.SHUT_WR)
        reply = b"".join(iter(lambda: sock.recv(65536), b""))
    code, out = wire.decode_reply(reply)
    return code, json.loads(out) if out.strip() else {}


def stacks_and_errors(log: str) -> list[str]:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [
        line["msg"] for line in lines if "exc" in line or line["level"] in ("error", "critical")
    ]


@pytest.fixture
def served(bridge_node, pycnid):
    """The node; after the test, pycnid's log holds no stack and no ERROR line."""
    yield bridge_node
    assert stacks_and_errors(pycnid.log()) == []


def no_new_links(bn: BridgeNode, before: set[str]) -> None:
    assert set(container_links(bn.node)) == before


def still_serving(bn: BridgeNode, netns_factory) -> None:
    conf = bridge_conf(pycni_ipam())
    cid, result = bn.add(conf, netns_factory("pod"))
    assert bn.run("DEL", {**conf, "prevResult": result}, cid).code == 0
    assert bn.residue().is_empty()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [100, 1000, 50_000])
def test_deep_nesting_is_code_6_on_every_verb(served, netns_factory, depth):
    before = set(container_links(served.node))
    conf = json.dumps(bridge_conf(pycni_ipam()))[:-1] + ', "args": ' + nested(depth) + "}"
    for plugin in ("bridge", "ipam"):
        for verb in VERBS:
            code, err = ask(served, plugin, verb, conf.encode())
            assert code == 1 and err["code"] == 6 and "deeper than" in err["details"], err
    no_new_links(served, before)
    still_serving(served, netns_factory)


def added(bn: BridgeNode, netns_factory) -> tuple[dict, str, str, dict]:
    pod = netns_factory("pod")
    conf = bridge_conf(pycni_ipam())
    cid, result = bn.add(conf, pod)
    return conf, cid, pod.path, result


def broken(result: dict, part: str, key: str, value) -> dict:
    prev = json.loads(json.dumps(result))
    if value is ...:
        del prev[part][0][key]
    else:
        prev[part][0][key] = value
    return prev


@pytest.mark.parametrize(
    "part,key,value,named",
    [
        ("routes", "dst", ..., "prevResult.routes[0].dst"),
        ("routes", "dst", 7, "prevResult.routes[0].dst"),
        ("routes", "gw", 3.5, "prevResult.routes[0].gw"),
        ("routes", "table", 2**32, "prevResult.routes[0].table"),
        ("interfaces", "mac", 5, "prevResult.interfaces[0].mac"),
        ("ips", "interface", 99, "prevResult.ips[0].interface"),
    ],
)
def test_check_with_a_malformed_prev_result_is_code_6_naming_it(
    served, netns_factory, part, key, value, named
):
    conf, cid, netns, result = added(served, netns_factory)
    out = served.run("CHECK", {**conf, "prevResult": broken(result, part, key, value)}, cid, netns)
    assert out.code == 1 and out.json["code"] == 6 and out.json["msg"] == f"invalid {named}"
    assert served.run("CHECK", {**conf, "prevResult": result}, cid, netns).code == 0


@pytest.mark.parametrize("literal,named", [("NaN", "decode"), ("1e400", "decode")])
def test_check_with_non_finite_numbers_is_code_6(served, netns_factory, literal, named):
    conf, cid, netns, result = added(served, netns_factory)
    text = json.dumps({**conf, "prevResult": result}).replace(
        '"interface": 2', f'"interface": {literal}'
    )
    code, err = ask(served, "bridge", "CHECK", text.encode(), cid)
    assert code == 1 and err["code"] == 6 and named in err["msg"]


@pytest.mark.parametrize(
    "route,named",
    [
        ({"dst": "0.0.0.0/0", "table": 2**32}, "ipam.routes[0].table"),
        ({"dst": "0.0.0.0/0", "priority": -1}, "ipam.routes[0].priority"),
        ({"dst": "0.0.0.0/0", "mtu": 2**32}, "ipam.routes[0].mtu"),
        ({"dst": "0.0.0.0/0", "advmss": 2**33}, "ipam.routes[0].advmss"),
        ({"dst": "0.0.0.0/0", "scope": 256}, "ipam.routes[0].scope"),
    ],
)
def test_route_integers_netlink_cannot_carry_are_code_7(served, netns_factory, route, named):
    before = set(container_links(served.node))
    out = served.run(
        "ADD", bridge_conf(pycni_ipam(routes=[route])), new_cid(), netns_factory("pod").path
    )
    assert out.json["code"] == 7 and out.json["msg"] == f"invalid {named}"
    no_new_links(served, before)
    assert served.residue().is_empty()


@pytest.mark.parametrize("name", ["a\u0000b", "\ud800", "ü" * 8])
def test_a_bridge_name_the_kernel_would_cut_is_code_7(served, netns_factory, name):
    before = set(container_links(served.node))
    out = served.run(
        "ADD", bridge_conf(pycni_ipam(), bridge=name), new_cid(), netns_factory("pod").path
    )
    assert out.json["code"] == 7 and "bridge" in out.json["msg"]
    no_new_links(served, before)
    assert "a" not in container_links(served.node)


@pytest.mark.parametrize(
    "ipam,code,words",
    [
        (0, 7, "invalid key 'ipam'"),
        ({"type": "a/b"}, 7, "invalid key 'ipam.type'"),
        ({"subnet": "10.22.0.0/24"}, 7, "missing key 'ipam.type'"),
        ({"type": "no-such-ipam"}, 4, "CNI_PATH"),
        ({"type": "pycni-ipam", "ranges": [[{"subnet": "10.22.0.0/33"}]]}, 7, "ipam.ranges[0][0]"),
    ],
)
def test_a_bad_ipam_section_makes_nothing_and_logs_no_stack(
    served, netns_factory, ipam, code, words
):
    before = set(container_links(served.node))
    pod = netns_factory("pod")
    conf = bridge_conf(None)
    conf["ipam"] = ipam
    for verb in ("ADD",) if "ranges" in words else ("ADD", "CHECK", "DEL"):
        out = served.run(
            verb, {**conf, "prevResult": {}} if verb == "CHECK" else conf, new_cid(), pod.path
        )
        assert out.json["code"] == code and words in out.json["msg"] + out.json.get("details", "")
    no_new_links(served, before)
    assert served.residue().is_empty()


@pytest.mark.parametrize("verb", VERBS)
def test_a_netconf_without_type_is_code_7_on_every_verb(served, netns_factory, verb):
    before = set(container_links(served.node))
    conf = {k: v for k, v in bridge_conf(pycni_ipam()).items() if k != "type"}
    out = served.run(verb, conf, new_cid(), netns_factory("pod").path)
    assert out.code == 1 and out.json["code"] == 7 and "'type'" in out.json["msg"]
    no_new_links(served, before)
    assert served.residue().is_empty()


@pytest.mark.parametrize("verb", VERBS)
def test_pycni_ipam_without_ipam_type_is_code_7(served, cni_bin, netns_factory, verb):
    ipam = {k: v for k, v in pycni_ipam().items() if k != "type"}
    conf = {**bridge_conf(ipam), "type": "bridge"}
    out = run_plugin(
        f"{cni_bin}/pycni-ipam",
        verb,
        conf,
        container_id=new_cid(),
        netns=netns_factory("pod").path,
        cni_path=served.cni_path,
        socket=served.socket,
    )
    assert out.code == 1 and out.json["code"] == 7 and out.json["msg"] == "missing key 'ipam.type'"
    assert served.residue().is_empty()


def test_a_repeated_add_is_code_103_and_keeps_the_first(served, netns_factory):
    conf, cid, netns, result = added(served, netns_factory)
    again = served.run("ADD", conf, cid, netns)
    assert again.json["code"] == 103 and "run DEL" in again.json["details"]
    assert served.run("CHECK", {**conf, "prevResult": result}, cid, netns).code == 0


def test_gc_with_a_malformed_attachment_list_changes_nothing(served, netns_factory):
    conf, cid, netns, result = added(served, netns_factory)
    for entries, named in (
        (
            [{"containerID": "\ud800", "ifname": "eth0"}],
            "cni.dev/valid-attachments[0].containerID",
        ),
        ([{"containerID": 5, "ifname": "eth0"}], "cni.dev/valid-attachments[0].containerID"),
    ):
        out = served.run("GC", {**conf, "cni.dev/valid-attachments": entries}, "")
        assert out.json["code"] == 7 and out.json["msg"] == f"invalid {named}"
    assert served.run("CHECK", {**conf, "prevResult": result}, cid, netns).code == 0


def test_a_route_the_kernel_refuses_is_code_104_naming_the_step(served, netns_factory):
    """An unreachable gateway: the kernel refuses the route in the pod (ENETUNREACH)."""
    route = {"dst": "10.99.0.0/16", "gw": "192.168.250.1"}
    out = served.run(
        "ADD", bridge_conf(pycni_ipam(routes=[route])), new_cid(), netns_factory("pod").path
    )
    assert out.json["code"] == 104 and "failed to configure eth0" in out.json["msg"]
    assert "netlink error" in out.json["details"]
    assert served.residue().is_empty()


@pytest.fixture
def broken_ipam(tmp_path, served):
    """A foreign IPAM plugin in CNI_PATH that fails every verb without a CNI error, and one
    whose ADD prints something that is not a result."""
    for name, body in (
        ("broken-ipam", "echo 'it broke' >&2; exit 1"),
        ("garbled-ipam", 'echo \'{"ips": [{"address": 7}]}\''),
        ("buggy-ipam", 'echo \'{"code": 999, "msg": "no IP ranges specified"}\'; exit 1'),
    ):
        script = tmp_path / name
        script.write_text(f"#!/bin/sh\ncat >/dev/null\n{body}\n")
        script.chmod(0o755)
    served.cni_path = f"{tmp_path}:{served.cni_path}"
    return served


def test_a_gc_whose_ipam_fails_is_code_105_listing_it(broken_ipam):
    conf = bridge_conf({"type": "broken-ipam"})
    out = broken_ipam.run("GC", {**conf, "cni.dev/valid-attachments": []}, "")
    assert out.json["code"] == 105 and "repeat GC" in out.json["msg"]
    assert "IPAM GC: IPAM plugin broken-ipam failed" in out.json["details"]


def test_a_foreign_ipam_result_that_is_not_one_is_code_106(broken_ipam, netns_factory):
    out = broken_ipam.run(
        "ADD", bridge_conf({"type": "garbled-ipam"}), new_cid(), netns_factory("pod").path
    )
    assert out.json["code"] == 106 and "garbled-ipam" in out.json["msg"]
    assert "result of IPAM plugin garbled-ipam.ips[0].address" in out.json["details"]
    assert broken_ipam.residue().is_empty()


def test_a_foreign_ipams_internal_error_is_106_not_999(broken_ipam, netns_factory):
    """999 is pycni's own bug code (README, Errors): another plugin's 999 (host-local answers
    it for a config without ranges) is 106 naming that plugin and its message."""
    out = broken_ipam.run(
        "ADD", bridge_conf({"type": "buggy-ipam"}), new_cid(), netns_factory("pod").path
    )
    assert out.json["code"] == 106, out.json
    assert out.json["msg"] == "buggy-ipam: no IP ranges specified"
    assert "buggy-ipam answered code 999" in out.json["details"]
    assert broken_ipam.residue().is_empty()


def test_a_foreign_ipam_add_with_an_unreadable_result_is_undone(tmp_path, served, netns_factory):
    """Found by make fuzz (host-local with `"routes": [{}]` leased an address, then printed a
    route pycni cannot read): the ADD that fails with 106 releases what the IPAM leased."""
    leases = tmp_path / "leases"
    leases.mkdir()
    script = tmp_path / "leaky-ipam"
    script.write_text(f"""#!/bin/sh
cat >/dev/null
case "$CNI_COMMAND" in
ADD) touch {leases}/"$CNI_CONTAINERID"
     echo '{{"ips": [{{"address": "10.9.0.2/24"}}], "routes": [{{}}]}}' ;;
DEL) rm -f {leases}/"$CNI_CONTAINERID" ;;
esac
""")
    script.chmod(0o755)
    served.cni_path = f"{tmp_path}:{served.cni_path}"
    out = served.run(
        "ADD", bridge_conf({"type": "leaky-ipam"}), new_cid(), netns_factory("pod").path
    )
    assert out.json["code"] == 106 and "unreadable result" in out.json["msg"]
    assert list(leases.iterdir()) == []
    assert served.residue().is_empty()
