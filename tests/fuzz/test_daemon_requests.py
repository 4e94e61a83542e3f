"""pycnid over its socket with generated netconfs and prevResults.

Every case: a reply with a known code (never 999) and a non-empty msg, or success; no stack
in the log; a refused request changes no state, an accepted ADD is deleted again and leaves
nothing; the anchor attachment still CHECKs afterwards.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni.spec.result import render as render_result

from .budget import cases
from .node import FuzzNode, new_cid
from .strategies import VERSIONS, Raw, garbage_stdin, mutated, result_in, to_bytes, version_for

pytestmark = pytest.mark.netns
PLUGINS = (("bridge", "pycni-ipam"), ("bridge", "host-local"), ("ipam", "pycni-ipam"))
VERBS = ("ADD", "DEL", "CHECK", "STATUS", "GC")
DATA_DIR = frozenset({("ipam", "dataDir")})


def base_conf(
    fz: FuzzNode, plugin: str, ipam: str, command: str, version: str, with_prev: bool
) -> dict:
    conf = fz.bridge_conf(version, ipam) if plugin == "bridge" else fz.ipam_conf(version)
    if command == "GC":
        conf["cni.dev/valid-attachments"] = [{"containerID": "fzother", "ifname": "eth0"}]
    if command in ("DEL", "CHECK") and with_prev:
        conf["prevResult"] = result_in(version, fz.pods[0].path)
    return conf


def run_case(
    fz: FuzzNode, plugin: str, command: str, stdin: bytes, netns: str, ifname: str = "eth0"
) -> None:
    cid = new_cid()

    def send(verb: str):
        return lambda: (
            *fz.request(plugin, fz.env(verb, cid, ifname, netns), stdin, netns or None),
            "",
        )

    fz.exercise(
        command,
        send(command),
        send("DEL"),
        stdin,
        f"{plugin} {command} netns={netns!r} stdin={stdin[:400]!r}",
    )


@cases(60)
@given(data=st.data())
def test_netconf_of_every_plugin(fz, data):
    plugin, ipam = data.draw(st.sampled_from(PLUGINS), label="plugin")
    command = data.draw(st.sampled_from(VERBS), label="command")
    version = data.draw(version_for(command), label="version")
    conf = base_conf(fz, plugin, ipam, command, version, data.draw(st.booleans()))
    stdin = data.draw(
        st.one_of(*[mutated(conf, protect=DATA_DIR)] * 5, garbage_stdin), label="stdin"
    )
    with_netns = command in ("ADD", "CHECK") or data.draw(st.booleans())
    run_case(fz, plugin, command, stdin, fz.pods[0].path if with_netns else "")


@cases(30)
@given(data=st.data())
def test_check_with_a_malformed_prev_result(fz, data):
    """CHECK of the live anchor attachment, its real ADD result in each CHECK version, mutated."""
    version = data.draw(st.sampled_from(("0.4.0", "1.0.0", "1.1.0")), label="version")
    prev = render_result(fz.anchor["result"], version)
    prev_text = data.draw(mutated(prev, max_mutations=2), label="prevResult")
    conf = {
        **fz.anchor["conf"],
        "cniVersion": version,
        "prevResult": Raw(prev_text.decode("utf-8", "surrogatepass")),
    }
    stdin = to_bytes(conf)

    def send():
        return (
            *fz.request(
                "bridge",
                fz.env("CHECK", "fzanchor", "eth9", fz.pods[0].path),
                stdin,
                fz.pods[0].path,
            ),
            "",
        )

    fz.exercise("CHECK", send, None, stdin, f"CHECK of the anchor, prevResult {prev_text[:400]!r}")


@cases(20)
@given(data=st.data())
def test_del_with_a_prev_result_of_every_version(fz, data):
    """DEL of an attachment that does not exist, with a (malformed) prevResult of each version:
    nothing to release, so success or a config error, and nothing else touched."""
    version = data.draw(st.sampled_from(VERSIONS), label="version")
    plugin, ipam = data.draw(st.sampled_from(PLUGINS), label="plugin")
    conf = base_conf(fz, plugin, ipam, "DEL", version, with_prev=False)
    prev_text = data.draw(mutated(result_in(version, fz.pods[0].path)), label="prevResult")
    stdin = to_bytes({**conf, "prevResult": Raw(prev_text.decode("utf-8", "surrogatepass"))})
    run_case(fz, plugin, "DEL", stdin, "")


@cases(15)
@given(data=st.data())
def test_env_of_the_daemon(fz, data):
    """CNI_* values as strings reach pycnid whatever the executable let through."""
    command = data.draw(st.sampled_from(VERBS), label="command")
    odd = st.one_of(
        st.text(max_size=20),
        st.sampled_from(["", "\udcff", "ü" * 8, "a" * 16, "a/b", ".", "-x", "K", "=v", "\ud800"]),
    )
    ifname = data.draw(st.one_of(st.just("eth0"), odd), label="ifname")
    env = fz.env(
        command,
        data.draw(st.one_of(st.just(new_cid()), odd), label="cid"),
        ifname,
        fz.pods[0].path,
        data.draw(st.one_of(st.just(""), odd), label="args"),
    )
    stdin = json.dumps(base_conf(fz, "bridge", "pycni-ipam", command, "1.1.0", False)).encode()

    def send(verb: str):
        return lambda: (
            *fz.request("bridge", {**env, "CNI_COMMAND": verb}, stdin, fz.pods[0].path),
            "",
        )

    fz.exercise(command, send(command), send("DEL"), stdin, f"env {env!r}")
