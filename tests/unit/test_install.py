"""cni/install.py, the DaemonSet's init container installer, in temp dirs (never the machine's
/opt/cni/bin or /etc/cni/net.d): a fresh install, a re-run that changes nothing, a changed
ConfigMap, a foreign conflist of pycni's name refused and left byte for byte, a foreign one of
another name left alone, launchers that run from the package copy, and the node's paths (not
the container's) baked into the launchers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cni.install import MARKER, Target, launcher_root, main
from cni.runtime.conflist import conflist_from_bytes

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ("pycni-bridge", "pycni-ipam", "pycni-svc")
CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "pycni",
    "plugins": [{"type": "pycni-bridge", "bridge": "pycni0", "ipam": {"type": "pycni-ipam"}}],
}
FOREIGN = b'{"cniVersion": "1.0.0", "name": "other", "plugins": [{"type": "bridge"}]}\n'


@pytest.fixture
def node(tmp_path):
    """A node at host root "/" whose directories are temp dirs, so the launchers run here."""
    source = tmp_path / "config" / "10-pycni.conflist"
    source.parent.mkdir()
    source.write_text(json.dumps(CONFLIST))
    target = Target(
        "/",
        str(tmp_path / "bin"),
        str(tmp_path / "net.d"),
        str(tmp_path / "lib"),
        os.path.realpath(sys.executable),
    )
    return target, source


def run(target: Target, source: Path, *extra: str) -> int:
    return main([
        "--conflist", str(source), "--host-root", target.host_root, "--bin-dir", target.bin_dir,
        "--conf-dir", target.conf_dir, "--lib-dir", target.lib_dir, "--python", target.python,
        *extra,
    ])  # fmt: skip


def snapshot(*dirs: str) -> dict[str, bytes]:
    return {
        str(p): p.read_bytes() for d in dirs for p in sorted(Path(d).rglob("*")) if p.is_file()
    }


def test_a_fresh_install_writes_launchers_package_and_marked_conflist(node):
    target, source = node
    assert run(target, source) == 0
    for plugin in PLUGINS:
        path = Path(target.bin_dir, plugin)
        assert os.stat(path).st_mode & 0o777 == 0o755
        first = path.read_text().splitlines()[0]
        assert first == f"#!{target.python} -IS"
        root = launcher_root(str(path))
        assert root and Path(root).parent == Path(target.lib_dir)
        assert Path(root, "cni", "exe.py").read_bytes() == (ROOT / "cni" / "exe.py").read_bytes()
    written = Path(target.conf_dir, "10-pycni.conflist").read_bytes()
    doc = json.loads(written)
    assert doc.pop(MARKER) and doc == CONFLIST
    assert conflist_from_bytes(written).name == "pycni"  # the runtime's loader takes it
    assert os.stat(Path(target.conf_dir, "10-pycni.conflist")).st_mode & 0o777 == 0o644


def test_the_launchers_run_from_the_package_copy_alone(node, tmp_path):
    """The node has no pycni installed: a launcher answers VERSION from the copy in lib-dir."""
    target, source = node
    assert run(target, source) == 0
    done = subprocess.run(
        [f"{target.bin_dir}/pycni-bridge"],
        env={"CNI_COMMAND": "VERSION", "PATH": "/usr/bin:/bin"},
        input=b'{"cniVersion": "1.0.0"}',
        capture_output=True,
        cwd=tmp_path,
        timeout=10,
    )
    assert done.returncode == 0, done.stderr
    assert "1.0.0" in json.loads(done.stdout)["supportedVersions"]


def test_a_rerun_changes_nothing(node):
    target, source = node
    assert run(target, source) == 0
    before = snapshot(target.bin_dir, target.conf_dir, target.lib_dir)
    conflist = Path(target.conf_dir, "10-pycni.conflist")
    inode = conflist.stat().st_ino
    assert run(target, source) == 0
    assert snapshot(target.bin_dir, target.conf_dir, target.lib_dir) == before
    assert conflist.stat().st_ino == inode  # not even rewritten with the same bytes
    assert len(os.listdir(target.lib_dir)) == 1


def test_a_changed_configmap_rewrites_our_conflist(node):
    target, source = node
    assert run(target, source) == 0
    source.write_text(json.dumps({**CONFLIST, "name": "pycni-2"}))
    assert run(target, source) == 0
    doc = json.loads(Path(target.conf_dir, "10-pycni.conflist").read_bytes())
    assert doc["name"] == "pycni-2" and MARKER in doc
    assert [n for n in os.listdir(target.conf_dir) if n.startswith(".")] == []  # no temp left


def test_a_foreign_conflist_of_our_name_is_refused_and_left_as_it_is(node, capsys):
    target, source = node
    os.makedirs(target.conf_dir)
    foreign = Path(target.conf_dir, "10-pycni.conflist")
    foreign.write_bytes(FOREIGN)
    assert run(target, source) == 1
    assert foreign.read_bytes() == FOREIGN
    err = capsys.readouterr().err
    assert str(foreign) in err and "not written by cni.install" in err
    assert not os.path.exists(target.bin_dir)  # refused before anything was written
    assert run(target, source, "--name", "11-pycni.conflist") == 0  # another name is free
    assert foreign.read_bytes() == FOREIGN


def test_a_foreign_conflist_of_another_name_is_left_alone_and_named_if_it_comes_first(
    node, capsys
):
    target, source = node
    os.makedirs(target.conf_dir)
    earlier = Path(target.conf_dir, "05-other.conflist")
    later = Path(target.conf_dir, "99-other.conflist")
    earlier.write_bytes(FOREIGN)
    later.write_bytes(FOREIGN)
    assert run(target, source) == 0
    assert earlier.read_bytes() == FOREIGN and later.read_bytes() == FOREIGN
    err = capsys.readouterr().err
    assert f"warning: {earlier} sorts before 10-pycni.conflist" in err
    assert str(later) not in err


def test_paths_baked_in_are_the_nodes_not_the_containers(tmp_path):
    host = tmp_path / "host"
    (host / "usr" / "bin").mkdir(parents=True)
    (host / "usr" / "bin" / "python3").symlink_to("python3.11")  # dangling here, as on a node
    source = tmp_path / "10-pycni.conflist"
    source.write_text(json.dumps(CONFLIST))
    assert main(["--conflist", str(source), "--host-root", str(host)]) == 0
    launcher = host / "opt" / "cni" / "bin" / "pycni-ipam"
    assert launcher.read_text().startswith("#!/usr/bin/python3 -IS\n")
    root = launcher_root(str(launcher))
    assert root and root.startswith("/opt/pycni/lib/cni-")
    assert (host / root.lstrip("/") / "cni" / "install.py").is_file()
    assert (host / "etc" / "cni" / "net.d" / "10-pycni.conflist").is_file()


def test_a_node_without_python3_is_refused_before_anything_is_written(tmp_path, capsys):
    source = tmp_path / "10-pycni.conflist"
    source.write_text(json.dumps(CONFLIST))
    host = tmp_path / "host"
    host.mkdir()
    assert main(["--conflist", str(source), "--host-root", str(host)]) == 1
    assert "the node has no /usr/bin/python3" in capsys.readouterr().err
    assert list(host.iterdir()) == []


def test_a_broken_conflist_is_refused(node, capsys):
    target, source = node
    source.write_text('{"cniVersion": "1.0.0", "plugins": []}')
    assert run(target, source) == 1
    assert "error:" in capsys.readouterr().err
    assert not os.path.exists(target.conf_dir)


def test_an_upgrade_keeps_the_package_the_old_launchers_use_and_prunes_older(node):
    target, source = node
    assert run(target, source) == 0
    current = launcher_root(f"{target.bin_dir}/pycni-bridge")
    assert current
    old = Path(target.lib_dir, "cni-000000000000")
    older = Path(target.lib_dir, "cni-111111111111")
    for copy in (old, older):
        (copy / "cni").mkdir(parents=True)
    for plugin in PLUGINS:  # launchers of the previous version
        path = Path(target.bin_dir, plugin)
        path.write_text(path.read_text().replace(current, str(old)))
    assert run(target, source) == 0
    assert sorted(os.listdir(target.lib_dir)) == sorted([old.name, os.path.basename(current)])
    assert launcher_root(f"{target.bin_dir}/pycni-svc") == current


def test_the_installer_loads_only_the_standard_library():
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); import cni.install; "
        "print(' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=10
    )
    assert done.returncode == 0, done.stderr
    ours = {m.split(".")[0] for m in done.stdout.split()} & {
        p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()
    }
    assert ours == {"cni"}
    stdlib = set(sys.stdlib_module_names) | {"cni", "__main__"}
    third = sorted(m for m in done.stdout.split() if m.split(".")[0] not in stdlib)
    assert third == [], third
