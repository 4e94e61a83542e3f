"""The real executables (pycni-bridge, pycni-ipam) with every CNI_* variable generated as bytes,
including non-UTF-8 ones, and generated netconfs.

Every case: exit within the hang guard, exactly one JSON object on stdout (a result, nothing
for another successful verb, or a spec error with a known code and a message), no traceback on
stderr; pycnid (when reached) logs no stack, changes nothing for a refused request and still
serves. CNI_NETNS is only ever the test pod or something that is not a netns (a FIFO, a file,
a directory, /dev/null, a missing path): never a namespace of this machine.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from .budget import cases
from .node import FuzzNode, run_exe
from .strategies import cni_environ, garbage_stdin, mutated, version_for

pytestmark = pytest.mark.netns
DATA_DIR = frozenset({("ipam", "dataDir")})


def base_conf(fz: FuzzNode, plugin: str, command: str, version: str) -> dict:
    if plugin == "ipam":
        return fz.ipam_conf(version)
    conf = fz.bridge_conf(version)
    if command == "GC":
        conf["cni.dev/valid-attachments"] = []
    return conf


@cases(40)
@given(data=st.data())
def test_executable_env_and_netconf(fz, odd_files, data):
    plugin = data.draw(st.sampled_from(["bridge", "ipam"]), label="plugin")
    netns = [
        os.fsencode(p)
        for p in (
            fz.pods[0].path,
            odd_files["fifo"],
            odd_files["file"],
            odd_files["dir"],
            odd_files["missing"],
            "/dev/null",
        )
    ]
    sockets = [os.fsencode(fz.socket)] * 4 + [
        os.fsencode(odd_files["missing"]),
        os.fsencode(odd_files["file"]),
    ]
    env = data.draw(
        cni_environ(
            netns=netns, sockets=sockets, cni_path=os.fsencode(f"{fz.cni_bin}:/usr/lib/cni")
        ),
        label="env",
    )
    command = env.get(b"CNI_COMMAND", b"").decode("utf-8", "replace")
    conf = base_conf(fz, plugin, command, data.draw(version_for(command), label="version"))
    stdin = data.draw(
        st.one_of(*[mutated(conf, max_mutations=1, protect=DATA_DIR)] * 4, garbage_stdin),
        label="stdin",
    )
    exe = os.path.join(fz.cni_bin, f"pycni-{plugin}")
    if not command:  # no CNI_COMMAND: the about text on stderr, exit 0, nothing else
        code, out, err = run_exe(exe, env, stdin)
        assert (code, out) == (0, "") and "Traceback" not in err, err
        return
    fz.exercise(
        command,
        lambda: run_exe(exe, env, stdin),
        lambda: run_exe(exe, {**env, b"CNI_COMMAND": b"DEL"}, stdin),
        stdin,
        f"pycni-{plugin} env={env!r} stdin={stdin[:300]!r}",
    )


@cases(10)
@given(data=st.data())
def test_version_answers_whatever_the_rest(fz, odd_files, data):
    """VERSION reads nothing but CNI_COMMAND: one answer listing the versions, exit 0."""
    env = data.draw(
        cni_environ(
            netns=[os.fsencode(odd_files["fifo"])],
            sockets=[os.fsencode(odd_files["missing"])],
            cni_path=b"",
            command=b"VERSION",
        ),
        label="env",
    )
    stdin = data.draw(garbage_stdin, label="stdin")
    code, out, err = run_exe(os.path.join(fz.cni_bin, "pycni-bridge"), env, stdin)
    assert code == 0 and "Traceback" not in err, (out, err)
    assert "1.1.0" in json.loads(out)["supportedVersions"]
