"""The plugin executables import only the standard library (and our own `cni` spec layer).

Each launcher is run exactly as its `#!python -IS` line runs it, inside a wrapper that prints
`sys.modules` at exit, for VERSION, an ADD whose daemon socket is unreachable (the slow error
path), a bad-JSON ADD and the bare "about" call. Any third-party module (pyroute2, click, the
etcd client, protobuf, grpc, netaddr …) loaded on these paths fails the test.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

MARK = "PYCNI-MODULES "
WRAPPER = f"""
import atexit, sys
atexit.register(lambda: sys.stderr.write("\\n{MARK}" + " ".join(sorted(sys.modules)) + "\\n"))
path = sys.argv[1]
sys.argv = [path]
with open(path) as fh:
    code = compile(fh.read(), path, "exec")
exec(code, {{"__name__": "__main__"}})
"""
OUR_MODULES = ("cni", "cni.exe", "cni.spec")
CONFIG = {
    "cniVersion": "1.0.0",
    "name": "imports",
    "type": "pycni-bridge",
    "bridge": "br-t",
    "ipam": {"type": "pycni-ipam", "ranges": [[{"subnet": "10.250.0.0/24"}]]},
}


def run_wrapped(launcher: str, env: dict, stdin: bytes) -> tuple[subprocess.CompletedProcess, set]:
    shebang = open_first_line(launcher)
    python, flags = shebang[2:].split()
    assert flags == "-IS", f"launcher must run isolated without site: {shebang}"
    proc = subprocess.run(
        [python, "-I", "-S", "-c", WRAPPER, launcher],
        input=stdin,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        timeout=30,
    )
    lines = [ln for ln in proc.stderr.decode().splitlines() if ln.startswith(MARK)]
    assert lines, f"wrapper printed no module list: {proc.stderr.decode()}"
    return proc, set(lines[-1][len(MARK) :].split())


def open_first_line(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.readline().strip()


def foreign(modules: set) -> list[str]:
    """Modules neither in the standard library nor in our stdlib-only spec layer."""
    stdlib = set(sys.stdlib_module_names) | {"__main__", "__mp_main__"}
    ours = [m for m in modules if m.split(".")[0] == "cni"]
    bad = [m for m in ours if not (m in OUR_MODULES or m.startswith("cni.spec."))]
    return sorted(bad + [m for m in modules if m.split(".")[0] not in stdlib | {"cni"}])


def cni_env(command: str, socket: str) -> dict:
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "imports-test",
        "CNI_IFNAME": "eth0",
        "CNI_NETNS": "/proc/self/ns/net",
        "CNI_PATH": "/nonexistent",
        "PYCNI_SOCKET": socket,
        "PYCNI_TIMEOUT": "5",
    }


@pytest.mark.parametrize("plugin", ["bridge", "ipam"])
def test_version_loads_only_stdlib(cni_bin, plugin):
    proc, modules = run_wrapped(f"{cni_bin}/pycni-{plugin}", {"CNI_COMMAND": "VERSION"}, b"")
    assert proc.returncode == 0
    assert "1.1.0" in json.loads(proc.stdout)["supportedVersions"]
    assert "cni.exe" in modules
    assert foreign(modules) == []


@pytest.mark.parametrize("plugin", ["bridge", "ipam"])
def test_add_with_unreachable_daemon_loads_only_stdlib(cni_bin, tmp_path, plugin):
    socket = str(tmp_path / "absent.sock")
    proc, modules = run_wrapped(
        f"{cni_bin}/pycni-{plugin}", cni_env("ADD", socket), json.dumps(CONFIG).encode()
    )
    reply = json.loads(proc.stdout)
    assert proc.returncode != 0
    assert reply["code"] == 11 and socket in reply["msg"]
    assert "cni.spec.errors" in modules  # the error was rendered on the slow path …
    assert foreign(modules) == []  # … which is still standard library only


def test_bad_json_and_about_load_only_stdlib(cni_bin, tmp_path):
    proc, modules = run_wrapped(
        f"{cni_bin}/pycni-bridge", cni_env("ADD", str(tmp_path / "absent.sock")), b"{not json"
    )
    assert json.loads(proc.stdout)["code"] == 6
    assert foreign(modules) == []
    proc, modules = run_wrapped(f"{cni_bin}/pycni-bridge", {}, b"")
    assert proc.returncode == 0 and b"CNI protocol versions" in proc.stderr
    assert foreign(modules) == []


def test_foreign_detects_a_third_party_module():
    """The check itself must catch what it is for (guards against an always-empty list)."""
    assert foreign({"os", "json", "cni.exe", "pyroute2", "pyroute2.iproute"}) == [
        "pyroute2",
        "pyroute2.iproute",
    ]
    assert foreign({"plugins.bridge.plugin"}) == ["plugins.bridge.plugin"]
