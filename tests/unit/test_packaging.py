"""`make install DESTDIR=...`: a staged install puts every file where it belongs, points the
launchers at the final (unstaged) paths, and never overwrites an operator's configuration."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PURELIB = sysconfig.get_path("purelib")
SCRIPTS = sysconfig.get_path("scripts")
PLUGINS = ("pycni-bridge", "pycni-ipam", "pycni-svc")
OPERATOR_CONFLIST = '{"cniVersion": "1.0.0", "name": "mine", "plugins": []}\n'


def read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def pip_flags() -> str:
    """Build offline when the local setuptools can build a wheel; else let pip fetch it."""
    import setuptools
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    if (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None:
        return "--no-build-isolation"
    return ""


def make(target: str, stage: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = ["make", "-C", REPO, target, f"DESTDIR={stage}", f"PYTHON={sys.executable}",
           f"PIP_FLAGS={pip_flags()}", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> tuple[str, subprocess.CompletedProcess]:
    stage = str(tmp_path_factory.mktemp("stage"))
    os.makedirs(f"{stage}/etc/cni/net.d")
    with open(f"{stage}/etc/cni/net.d/10-pycni.conflist", "w") as fh:
        fh.write(OPERATOR_CONFLIST)
    return stage, make("install", stage)


def test_launchers_point_at_the_final_package_path(staged):
    stage, _ = staged
    for name in PLUGINS:
        path = f"{stage}/opt/cni/bin/{name}"
        assert os.access(path, os.X_OK), f"{path} missing or not executable"
        text = read(path)
        first = text.splitlines()[0]
        assert first.startswith("#!/") and first.endswith(" -IS"), first
        assert f"sys.path.insert(0, {PURELIB!r})" in text
        assert stage not in text


def test_package_is_staged_and_runs_from_the_stage(staged, tmp_path):
    stage, _ = staged
    staged_root = f"{stage}{PURELIB}"
    assert os.path.isfile(f"{staged_root}/cni/exe.py")
    assert os.path.isfile(f"{staged_root}/ipam/daemon/main.py")
    assert os.access(f"{stage}{SCRIPTS}/pycnid", os.X_OK)
    # the staged launcher, re-pointed at the staged tree, answers VERSION from the staged code
    text = read(f"{stage}/opt/cni/bin/pycni-bridge").replace(repr(PURELIB), repr(staged_root))
    launcher = tmp_path / "pycni-bridge"
    launcher.write_text(text)
    launcher.chmod(0o755)
    proc = subprocess.run([str(launcher)], env={"CNI_COMMAND": "VERSION"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "1.1.0" in json.loads(proc.stdout)["supportedVersions"]


def test_existing_conflist_is_kept_and_new_config_written(staged):
    stage, proc = staged
    assert read(f"{stage}/etc/cni/net.d/10-pycni.conflist") == OPERATOR_CONFLIST
    assert "kept existing" in proc.stdout
    written = json.loads(read(f"{stage}/etc/pycni/pycnid.json"))
    assert written == json.loads(read(f"{REPO}/conf/pycnid.json"))


def test_reinstall_never_overwrites_the_daemon_config(staged):
    stage, _ = staged
    path = f"{stage}/etc/pycni/pycnid.json"
    with open(path, "w") as fh:
        fh.write('{"nodeName": "edited"}\n')
    make("install-conf", stage)
    assert read(path) == '{"nodeName": "edited"}\n'


def test_systemd_unit_runs_the_installed_daemon(staged):
    stage, _ = staged
    unit = read(f"{stage}/etc/systemd/system/pycnid.service")
    assert f"ExecStart={SCRIPTS}/pycnid --config /etc/pycni/pycnid.json" in unit
    assert "[Install]" in unit


def test_example_conflist_is_valid_and_uses_our_plugins():
    conf = json.loads(read(f"{REPO}/conf/10-pycni.conflist"))
    assert conf["name"] and conf["cniVersion"]
    first = conf["plugins"][0]
    assert first["type"] == "pycni-bridge"
    assert first["ipam"]["type"] == "pycni-ipam"
