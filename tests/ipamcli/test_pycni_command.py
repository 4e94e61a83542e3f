"""The real `pycni` command (a separate process): store selection from pycnid's config or the
command line, SQLite and etcd (plain and mTLS), JSON documents, and errors without tracebacks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from cni.spec.errors import InvalidConfig
from pycnid.config import load_daemon_config
from tests.fixtures.etcd import free_port
from tests.fixtures.ipam_contents import Contents

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
P = "/pycni/v1/"


def pycni_command() -> list[str]:
    """The installed console script (importing this tree); else the same entry point."""
    exe = shutil.which("pycni")
    return [exe] if exe else [sys.executable, "-m", "cli"]


def pycni(*args: str, code: int = 0, env: dict | None = None, timeout: float = 60):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYCNI_")}
    proc = subprocess.run(
        [*pycni_command(), "ipam", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**clean, "PYTHONPATH": REPO, **(env or {})},
    )
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def write_config(tmp_path, store: dict) -> str:
    path = tmp_path / "pycnid.json"
    path.write_text(json.dumps({"nodeName": "node1", "store": store, "ipam": {"reapGrace": 600}}))
    return str(path)


@pytest.fixture
def config(tmp_path, store_kind, request) -> str:
    """A pycnid config naming the test's store (as /etc/pycni/pycnid.json would)."""
    if store_kind == "sqlite":
        return write_config(
            tmp_path, {"type": "sqlite", "path": request.getfixturevalue("sqlite_path")}
        )
    endpoints = request.getfixturevalue("etcd_endpoints").split(",")
    return write_config(tmp_path, {"type": "etcd", "endpoints": endpoints})


def test_the_pycni_command_end_to_end(config, store):
    def run(*args: str, code: int = 0):
        out = pycni(*args, "--config", config, "-o", "json", code=code).stdout
        return json.loads(out) if out.strip() else None

    run("pool", "add", "p", "--cidr", "10.1.0.0/24", "--gateway", "first")
    run("pool", "add", "p6", "--cidr", "fd00:1::/120", "--block-size", "122")
    c = Contents(
        records={
            f"{P}pools/{n}": json.loads(store.get(f"{P}pools/{n}").value) for n in ("p", "p6")
        }
    )
    c.allocate("p", "10.1.0.2", "net/c1/eth0").allocate("p6", "fd00:1::2", "net/c1/eth0")
    c.allocate("p", "10.1.0.3", "net/c2/eth0")
    c.write(store)
    assert [p["used"] for p in run("show")["pools"]] == [2, 1]
    assert run("check")["ok"] is True
    c.block("p", "10.1.0.0/26", "node1")["allocations"]["10.1.0.9"] = "net/gone/eth0"
    c.list_in_handle("net/dup/eth0", "p", "10.1.0.3")
    c.write(store)
    assert [p["kind"] for p in run("check", code=2)["problems"]] == [
        "duplicate-address",
        "orphan-allocation",
    ]
    gc = run("gc")
    assert [f["status"] for f in gc["fixes"]] == ["applied", "applied"]
    assert gc["reaper"]["summary"] and gc["remaining"] == []
    assert run("check")["ok"] is True
    released = run("release", "fd00:1::2")
    assert released["released"] and released["handles"] == ["net/c1/eth0"]
    assert [i["address"] for i in run("show", "net/c1/eth0")["handles"][0]["ips"]] == [
        "10.1.0.2/24"
    ]
    assert run("show", "fd00:1::2")["matches"][0]["state"] == "cooling"
    run("pool", "rm", "p6")
    assert (
        "pool p still has addresses in use"
        in pycni("pool", "rm", "p", "--config", config, code=1).stderr
    )
    assert run("pool", "rm", "p", "--force")["releasedAddresses"] == 2
    assert run("pool", "ls") == {"pools": []} and run("check")["ok"] is True


@pytest.mark.etcd
def test_command_line_overrides_and_environment(sqlite_path, etcd_endpoints, tmp_path):
    sqlite_config = write_config(tmp_path, {"type": "sqlite", "path": sqlite_path})
    pycni(
        "pool",
        "add",
        "e",
        "--cidr",
        "10.2.0.0/16",
        "--etcd-endpoints",
        etcd_endpoints,
        "--config",
        sqlite_config,
    )
    pycni("pool", "add", "s", "--cidr", "10.3.0.0/16", "--config", sqlite_config)

    def names(*args: str, env: dict | None = None) -> list[str]:
        doc = json.loads(pycni("pool", "ls", "-o", "json", *args, env=env).stdout)
        return [p["name"] for p in doc["pools"]]

    assert names("--etcd-endpoints", etcd_endpoints) == ["e"]
    assert names("--store-path", sqlite_path) == ["s"]
    assert names(env={"PYCNI_CONFIG": sqlite_config}) == ["s"]
    assert names(env={"PYCNI_STORE_PATH": sqlite_path}) == ["s"]
    assert names(env={"PYCNI_ETCD_ENDPOINTS": etcd_endpoints}) == ["e"]


@pytest.mark.etcd
def test_etcd_with_mtls_from_the_config_or_the_command_line(etcd_tls, tmp_path):  # noqa: F811
    tls = etcd_tls.tls
    config = write_config(
        tmp_path,
        {
            "type": "etcd",
            "endpoints": etcd_tls.endpoints,
            "ca": tls.ca,
            "cert": tls.client_cert,
            "key": tls.client_key,
        },
    )
    pycni("pool", "add", "t", "--cidr", "10.4.0.0/16", "--config", config)
    flags = [
        "--etcd-endpoints",
        etcd_tls.endpoint,
        "--etcd-ca",
        tls.ca,
        "--etcd-cert",
        tls.client_cert,
        "--etcd-key",
        tls.client_key,
    ]
    assert json.loads(pycni("pool", "ls", "-o", "json", *flags).stdout)["pools"][0]["name"] == "t"
    refused = pycni(
        "pool", "ls", "--etcd-endpoints", etcd_tls.endpoint, "--etcd-ca", tls.ca, code=1
    )
    assert refused.stderr.startswith("pycni ipam: ") and etcd_tls.endpoint in refused.stderr


@pytest.mark.etcd
def test_unreachable_etcd_is_a_message_naming_it():
    endpoint = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    out = pycni("show", "--etcd-endpoints", endpoint, code=1)
    assert time.monotonic() - started < 15
    assert out.stderr.startswith("pycni ipam: ") and endpoint in out.stderr
    assert out.stdout == ""


def test_missing_store_or_config_is_a_message(tmp_path):
    missing = str(tmp_path / "nope.db")
    out = pycni("check", "--store-path", missing, code=1)
    assert f"store sqlite:{missing} does not exist" in out.stderr
    assert not os.path.exists(missing)  # never created by an operator tool
    out = pycni("pool", "ls", "--config", str(tmp_path / "none.json"), code=1)
    assert f"daemon config {tmp_path / 'none.json'} not found" in out.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert "is not valid JSON" in pycni("show", "--config", str(bad), code=1).stderr
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    out = pycni("show", "--store-path", str(corrupt), code=1)
    assert f"sqlite:{corrupt}" in out.stderr


def test_a_broken_section_pycni_does_not_use_does_not_stop_it(tmp_path, sqlite_path):
    """`pycni ipam` reads pycnid's own keys: a bad overlay section, which pycnid refuses
    naming the key, does not stop it."""
    path = tmp_path / "pycnid.json"
    store = {"type": "sqlite", "path": sqlite_path}
    path.write_text(json.dumps({"store": store, "overlay": {"backend": "carrier-pigeon"}}))
    pycni("pool", "add", "p", "--cidr", "10.7.0.0/16", "--config", str(path))
    assert "10.7.0.0/16" in pycni("pool", "ls", "--config", str(path)).stdout
    with pytest.raises(InvalidConfig, match="overlay"):
        load_daemon_config(str(path))
