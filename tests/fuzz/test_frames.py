"""Raw frames on pycnid's socket (the framing is cni/spec/wire.py), well-formed or not, with
and without file descriptors attached; and requests over the size limit: whatever
arrives, pycnid answers or closes and keeps serving.

A well-formed frame gets a reply (exit code line + a result, nothing, or a spec error with a
known code); a malformed one gets such a reply or none at all, never a partial one. Either way
pycnid logs no stack, keeps no fd, changes nothing and keeps serving.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni.spec import wire
from pycnid import server

from .budget import cases
from .node import FuzzNode
from .oracle import judge_output, parse_one_object
from .strategies import frames

pytestmark = pytest.mark.netns


def open_fds(fz: FuzzNode, which: str) -> list[int]:
    paths = {
        "none": [],
        "pod": [fz.pods[0].path],
        "devnull": ["/dev/null"],
        "two": [fz.pods[0].path, "/dev/null"],
        "five": ["/dev/null"] * 5,
    }[which]
    return [os.open(p, os.O_RDONLY) for p in paths]


def judge_reply(reply: bytes, framed: bool, context: str) -> None:
    if not reply and not framed:
        return  # not a pycni request at all: closing without an answer is fine
    head, sep, body = reply.partition(b"\n")
    assert sep and head.isdigit(), f"{context}: not a reply: {reply[:200]!r}"
    text = body.decode("utf-8")
    if head == b"0":  # a success: nothing, or one JSON object (VERSION's answer)
        assert not text.strip() or parse_one_object(text), f"{context}: reply {text!r}"
    else:
        judge_output("DEL", int(head), text)


def held_fds(fz: FuzzNode) -> list[str]:
    """What pycnid holds open that a request could have sent: the pod's netns, /dev/null
    (pycnid's own stdin/stdout are /dev/null too, hence a count, compared before and after)."""
    pod_ns = f"net:[{os.stat(fz.pods[0].path).st_ino}]"
    fd_dir = f"/proc/{fz.daemon.proc.pid}/fd"  # `ip netns exec` execs pycnid: same pid
    found = []
    for name in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except FileNotFoundError:
            continue
        if target in (pod_ns, "/dev/null"):
            found.append(target)
    return sorted(found)


def exchange(fz: FuzzNode, frame: bytes, fds: list[int], framed: bool, context: str) -> None:
    before, held_before = fz.snapshot(), held_fds(fz)
    fz.log.new_lines()
    try:
        reply = fz.send_frame(frame, tuple(fds))
    finally:
        for fd in fds:
            os.close(fd)
    judge_reply(reply, framed, context)
    fz.log.assert_no_stack(context)
    assert fz.snapshot() == before, f"{context} changed state"
    fz.probe(context)
    assert held_fds(fz) == held_before, f"{context}: pycnid kept a file descriptor it was sent"


@cases(40)
@given(data=st.data())
def test_raw_frames(fz, data):
    stdin = json.dumps(fz.bridge_conf("1.1.0")).encode()
    frame, framed = data.draw(frames(stdin), label="frame")
    fds = open_fds(
        fz, data.draw(st.sampled_from(["none", "pod", "devnull", "two", "five"]), label="fds")
    )
    exchange(fz, frame, fds, framed, f"frame {frame[:300]!r}")


@cases(2)
@given(
    command=st.sampled_from(["ADD", "DEL"]),
    extra=st.sampled_from([1, 1 << 20]),
    where=st.sampled_from(["padding", "prevResult"]),
)
def test_oversized_request_is_answered(fz, command, extra, where):
    """Over the request limit: a definitive answer (not a dropped connection, which the
    executable reports as 11, retried for ever), and no fd kept (the netns fd rides along)."""
    limit = getattr(wire, "MAX_REQUEST", None) or server.MAX_REQUEST
    conf = fz.bridge_conf("1.1.0")
    conf[where] = "x" * (limit + extra)
    stdin = json.dumps(conf).encode()
    env = fz.env(command, "fzhuge", "eth0", fz.pods[0].path)
    blob = b"\0".join(f"{k}={v}".encode() for k, v in env.items())
    frame = b"PYCNI1 bridge %d %d 1\n" % (len(blob), len(stdin)) + blob + stdin
    exchange(fz, frame, open_fds(fz, "pod"), True, f"{command} of {len(stdin)} bytes")
