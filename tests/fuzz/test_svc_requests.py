"""pycni-svc over pycnid's socket with generated netconfs, prevResults and CNI_ARGS.

The oracle's invariants hold for every verb (a known code and a message or a valid result, no
stack, a refused request changes nothing: links, leases, nft elements, endpoint records), and
pycni-svc's own: an accepted ADD returns prevResult unchanged, publishes exactly the record
its input names (checked against ``svc.expected_record``), writes nothing when repeated and
passes CHECK; its DEL removes it. A DEL of an attachment that was never added succeeds, with or
without netns and prevResult, whatever well-formed CNI_ARGS it carries, and leaves the anchor's
and another node's records alone.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni.spec.errors import CNIError
from cni.spec.request import MAX_DEPTH, decode_json
from cni.spec.result import canonical, render
from services.record import EndpointRecord
from store.keys import ENDPOINTS

from .budget import cases
from .node import FuzzNode, State, new_cid
from .oracle import Verdict
from .strategies import (
    COMMANDS,
    VERSIONS,
    garbage_stdin,
    mutated,
    mutation,
    result_in,
    to_bytes,
    version_for,
)
from .svc import (
    ADD_PODS,
    ALL_PODS,
    CNI_SECTIONS,
    add_svc_anchors,
    any_cni_args,
    changed_keys,
    cni_args_text,
    expected_record,
    record_problems,
    svc_conf,
)

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def svc_fz(fz: FuzzNode) -> FuzzNode:
    add_svc_anchors(fz)
    return fz


class Case:
    """One attachment's requests to the svc handler, all with the same stdin and CNI_ARGS."""

    def __init__(
        self, fz: FuzzNode, stdin: bytes, args: str, netns: str, ifname: str = "eth0"
    ) -> None:
        self.fz, self.stdin, self.args, self.netns, self.ifname = fz, stdin, args, netns, ifname
        self.cid = new_cid()

    def send(self, verb: str) -> tuple[int, str, str]:
        env = self.fz.env(verb, self.cid, self.ifname, self.netns, self.args)
        return (*self.fz.request("svc", env, self.stdin, self.netns or None), "")

    def run(self, command: str) -> Verdict:
        context = (
            f"svc {command} netns={self.netns!r} CNI_ARGS={self.args[:300]!r} "
            f"stdin={self.stdin[:400]!r}"
        )
        return self.fz.exercise(
            command,
            lambda: self.send(command),
            lambda: self.send("DEL"),
            self.stdin,
            context,
            accepted=self.check_accepted_add,
        )

    def check_accepted_add(self, verdict: Verdict, before: State) -> None:
        """What an accepted ADD must have done; on a failure the ADD is still deleted, so
        the next case starts from the anchors alone."""
        try:
            self.check_add_effects(verdict, before)
        except BaseException:
            self.send("DEL")
            raise

    def check_add_effects(self, verdict: Verdict, before: State) -> None:
        config = json.loads(self.stdin)
        version = str(config["cniVersion"])
        self.check_output(verdict.value, config["prevResult"], version)
        self.check_published(config, dict(before.endpoints))
        published = self.fz.endpoints()
        again = self.send("ADD")
        assert again[0] == 0 and json.loads(again[1]) == verdict.value, f"repeated ADD: {again}"
        assert self.fz.endpoints() == published, "a repeated ADD rewrote the endpoint record"
        if version in VERSIONS and version >= "0.4.0":
            exit_code, stdout, _ = self.send("CHECK")
            assert (exit_code, stdout) == (0, ""), f"CHECK right after the ADD: {stdout}"

    def check_output(self, output: dict | None, prev: dict, version: str) -> None:
        """prevResult unchanged: exactly it when it is pycni-bridge's, else what the result
        model reads of it, rendered in the netconf's version."""
        if prev == result_in(version, self.fz.pods[0].path):
            assert output == prev, f"ADD changed prevResult: {output!r}"
        else:
            assert output == render(canonical(prev, version), version), (
                f"ADD changed prevResult {prev!r}: {output!r}"
            )

    def check_published(self, config: dict, before: dict) -> None:
        want = expected_record(config, self.args, self.cid, self.ifname)
        after = self.fz.endpoints()
        assert changed_keys(before, after) == {want.key}, (
            f"ADD should write {want.key} only; changed {sorted(changed_keys(before, after))}"
        )
        got = EndpointRecord.from_bytes(want.key, after[want.key][1])
        assert got == want, f"ADD published {got!r}, its input says {want!r}"
        assert not record_problems(got), f"ADD accepted {record_problems(got)}"


def decodable(stdin: bytes) -> bool:
    """Whether the netconf is JSON pycnid reads at all (a mutated args.cni may nest deeper
    than its limit or hold 1e400: code 6 before any plugin runs, rightly). The nesting is
    counted in the text: a deep value a repeated key discards may or may not exhaust the
    decoder's recursion, by how deep the caller's stack already is."""
    try:
        decode_json(stdin, "network config")
    except CNIError:
        return False
    return nesting(stdin.decode("utf-8", "surrogatepass")) <= MAX_DEPTH


def nesting(text: str) -> int:
    """The deepest bracket nesting of JSON text, brackets inside strings apart."""
    depth = deepest = 0
    for token in re.sub(r'"(\\.|[^"\\])*"', "", text):
        depth += (token in "[{") - (token in "]}")
        deepest = max(deepest, depth)
    return deepest


@cases(45)
@given(data=st.data())
def test_svc_netconf_and_cni_args_of_every_verb(svc_fz, data):
    command = data.draw(st.sampled_from(COMMANDS), label="command")
    version = data.draw(version_for(command), label="version")
    with_prev = command == "ADD" or data.draw(st.booleans(), label="prevResult")
    conf = svc_conf(svc_fz, command, version, with_prev)
    stdin = data.draw(st.one_of(*[mutated(conf)] * 5, garbage_stdin), label="stdin")
    args = data.draw(any_cni_args(ADD_PODS if command == "ADD" else ALL_PODS), label="CNI_ARGS")
    with_netns = data.draw(st.sampled_from([True, True, True, False]), label="netns")
    Case(svc_fz, stdin, args, svc_fz.pods[0].path if with_netns else "").run(command)


@cases(30)
@given(data=st.data())
def test_svc_add_of_a_valid_netconf_with_generated_cni_args(svc_fz, data):
    """The netconf valid, its args.cni pycni-bridge's, a listed shape or mutated once: most
    ADDs are accepted, so the published record is checked against its input, not just the
    reply."""
    version = data.draw(st.sampled_from(VERSIONS), label="version")
    conf = svc_conf(svc_fz, "ADD", version, with_prev=True)
    shape = data.draw(st.integers(0, 3), label="args shape")
    if shape == 1:
        conf["args"] = {"cni": data.draw(st.sampled_from(CNI_SECTIONS), label="args.cni")}
    elif shape == 2:
        conf["args"] = data.draw(mutation(conf["args"]), label="args")
    args = data.draw(cni_args_text(ADD_PODS), label="CNI_ARGS")
    Case(svc_fz, to_bytes(conf, data.draw(st.booleans())), args, svc_fz.pods[0].path).run("ADD")


@cases(30)
@given(data=st.data())
def test_svc_del_of_nothing_succeeds(svc_fz, data):
    """A DEL after nothing (a new containerID; the Pod may be the anchor's or another node's):
    nothing of its attachment exists, so it succeeds, with or without netns, with prevResult
    absent, valid or malformed, whatever its args.cni and well-formed CNI_ARGS say, and removes
    nothing."""
    version = data.draw(st.sampled_from(VERSIONS), label="version")
    conf = svc_conf(svc_fz, "DEL", version, with_prev=data.draw(st.booleans(), label="prev"))
    for key in ("args", "prevResult"):
        if key in conf and data.draw(st.booleans()):
            conf[key] = data.draw(mutation(conf[key]), label=key)
    args = data.draw(cni_args_text(ALL_PODS), label="CNI_ARGS")
    netns = data.draw(st.sampled_from([svc_fz.pods[0].path, ""]), label="netns")
    ifname = data.draw(st.sampled_from(["eth0", "eth9"]), label="ifname")
    stdin = to_bytes(conf)
    verdict = Case(svc_fz, stdin, args, netns, ifname).run("DEL")
    assert verdict.ok or not decodable(stdin), f"DEL of nothing refused: {verdict.value}"
    assert len([k for k in svc_fz.endpoints() if k.startswith(ENDPOINTS)]) == 2


attachments = st.fixed_dictionaries(
    {"containerID": st.sampled_from(["fzanchor", "fzremote", "fzother", "fzc-1"])},
    optional={"ifname": st.sampled_from(["eth0", "eth9", ""])},
)


@cases(15)
@given(data=st.data())
def test_svc_gc_of_a_network_with_nothing_on_this_node_succeeds(svc_fz, data):
    """GC of ``fzsvc`` (only another node's record in it) with any valid-attachments list, or
    none (then nothing is valid): success, and the other node's and the anchor network's
    records stay."""
    conf = svc_conf(svc_fz, "GC", "1.1.0", with_prev=False)
    valid = data.draw(st.one_of(st.none(), st.lists(attachments, max_size=4)), label="valid")
    if valid is None:
        del conf["cni.dev/valid-attachments"]
    else:
        conf["cni.dev/valid-attachments"] = valid
    verdict = Case(svc_fz, to_bytes(conf), "", "").run("GC")
    assert verdict.ok, f"GC refused: {verdict.value}"


NEWLINES = {
    "args.cni.labels key": ({"labels": {"app\n": "web"}}, ""),
    "args.cni.labels value": ({"labels": [{"key": "app", "value": "web\n"}]}, ""),
    "CNI_ARGS PYCNI_LABELS value": ({}, ";PYCNI_LABELS=app:web\n,tier:front"),
    "args.cni.ports name": ({"ports": [{"name": "http\n", "containerPort": 80}]}, ""),
}


@pytest.mark.parametrize("where", sorted(NEWLINES))
def test_a_name_with_a_trailing_newline_is_refused(svc_fz, where):
    cni, extra_args = NEWLINES[where]
    conf = {**svc_conf(svc_fz, "ADD", "1.1.0", with_prev=True), "args": {"cni": cni}}
    case = Case(
        svc_fz,
        json.dumps(conf).encode(),
        f"K8S_POD_NAMESPACE=fz;K8S_POD_NAME=web-0{extra_args}",
        svc_fz.pods[0].path,
    )
    before = svc_fz.endpoints()
    exit_code, stdout, _ = case.send("ADD")
    if exit_code == 0:
        assert case.send("DEL")[0] == 0
    assert (exit_code, json.loads(stdout).get("code")) == (1, 7), f"{where} accepted: {stdout}"
    assert svc_fz.endpoints() == before
