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
    cmd = [
        "make",
        "-C",
        REPO,
        target,
        f"DESTDIR={stage}",
        f"PYTHON={sys.executable}",
        f"PIP_FLAGS={pip_flags()}",
        *extra,
    ]
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
    assert os.path.isfile(f"{staged_root}/pycnid/main.py")
    assert os.access(f"{stage}{SCRIPTS}/pycnid", os.X_OK)
    # the staged launcher, re-pointed at the staged tree, answers VERSION from the staged code
    text = read(f"{stage}/opt/cni/bin/pycni-bridge").replace(repr(PURELIB), repr(staged_root))
    launcher = tmp_path / "pycni-bridge"
    launcher.write_text(text)
    launcher.chmod(0o755)
    proc = subprocess.run(
        [str(launcher)], env={"CNI_COMMAND": "VERSION"}, capture_output=True, text=True, timeout=30
    )
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


# --- `make test` on a fresh machine: the dependency step installs only what is missing ----------

RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
exit {code}
"""
# the interpreter as the Makefile sees it: records `-m pip`, runs everything else for real
PYTHON_WRAPPER = """#!/bin/sh
case " $* " in *" -m pip "*) echo "pip $*" >> "{log}"; exit 0;; esac
exec {python} "$@"
"""


def fake_tools(tmp_path, **scripts: str) -> tuple[dict, str]:
    """A PATH whose apt-get records its calls and fails, plus ``scripts`` (name -> text);
    and the log every fake writes its calls to."""
    bin_dir, log = tmp_path / "bin", str(tmp_path / "calls.log")
    bin_dir.mkdir()
    for name, text in {"apt-get": RECORDER.format(log=log, code=1), **scripts}.items():
        path = bin_dir / name
        path.write_text(text.format(log=log, python=sys.executable))
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return env, log


def calls(log: str) -> list[str]:
    return read(log).splitlines() if os.path.exists(log) else []


def test_make_test_runs_the_dependency_step_first_and_with_all_present_installs_nothing(tmp_path):
    env, log = fake_tools(tmp_path, python=PYTHON_WRAPPER)
    wrapper = str(tmp_path / "bin" / "python")
    proc = subprocess.run(
        ["make", "-C", REPO, "test", f"PYTHON={wrapper}", "PYTEST=echo the-tests-ran"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr  # names what is missing, if anything
    out = proc.stdout
    steps = [
        out.find(s)
        for s in (
            "==> Debian packages: all present",
            "==> Python packages: all present",
            "the-tests-ran",
        )
    ]
    assert -1 not in steps and steps == sorted(steps), out
    assert calls(log) == []  # neither apt-get nor pip ran


def test_the_dependency_step_installs_only_what_is_missing(tmp_path):
    dpkg_query = """#!/bin/sh
for pkg; do case $pkg in -*) ;; socat) echo "not-installed socat";; *) echo "installed $pkg";; esac
done
"""
    # the requirement check reports one missing requirement; everything else runs for real
    python = PYTHON_WRAPPER.replace(
        'case " $* "',
        'case " $* " in *python_deps.py*) echo "hypothesis (not installed)"; '
        'exit 1;; esac\ncase " $* "',
    )
    env, log = fake_tools(
        tmp_path,
        python=python,
        **{
            "dpkg-query": dpkg_query,
            "apt-get": RECORDER.replace("{code}", "0"),
            "id": "#!/bin/sh\necho 0\n",
        },
    )
    proc = subprocess.run(
        ["bash", f"{REPO}/scripts/install-deps.sh"],
        capture_output=True,
        text=True,
        env={**env, "PYTHON": str(tmp_path / "bin" / "python")},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Debian packages: installing socat" in proc.stdout
    assert "hypothesis (not installed)" in proc.stdout
    apt = [c for c in calls(log) if c.startswith("apt-get")]
    assert apt == ["apt-get update -qq", "apt-get install -y -qq --no-install-recommends socat"], (
        calls(log)
    )
    pip = [c for c in calls(log) if c.startswith("pip")]
    assert len(pip) == 2 and "--version" in pip[0] and pip[1].endswith("-e .[test,nft,lint]"), pip


def load_python_deps():
    spec = importlib.util.spec_from_file_location("python_deps", f"{REPO}/scripts/python_deps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "requirement,met",
    [
        ("pytest>=8", True),
        ("pytest", True),
        ("pytest>=999", False),
        ("no-such-distribution-pycni", False),
        ("pytest>=8; python_version > '3'", False),
        (f"pytest=={pytest.__version__}", True),
        ("pytest==0.1", False),
    ],
)
def test_python_deps_judges_a_requirement_by_installed_metadata(requirement, met):
    assert (load_python_deps().unmet(requirement) is None) == met


def test_python_deps_compares_release_numbers():
    deps = load_python_deps()
    assert deps.release("1.0.2.post1") == (1, 0, 2) and deps.release("0.9rc1") == (0, 9)
    assert not deps.older(deps.release("1.0"), deps.release("1.0.0"))
    assert deps.older(deps.release("0.8.9"), deps.release("0.9"))
    assert not deps.older(deps.release("6.155.2"), deps.release("6.100"))
