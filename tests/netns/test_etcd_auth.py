"""pycnid on etcd with mTLS and user authentication (the etcd in the node namespace, users made
by tests/fixtures/etcd.py ``enable_auth``): ADD and DEL through the pycni-ipam executable, the
password in no log line, metric, command line or environment of pycnid; a wrong password, a
role that may only read, a client certificate etcd does not trust: pycnid exits 1 at start
naming the cause."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.fixtures.daemon import SCRAPE, Pycnid, daemon_config, parse_samples
from tests.fixtures.etcd import make_tls
from tests.fixtures.ipam import addresses, ipam_conf, run_ipam

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METRICS = "127.0.0.1:9617"
CONF = ipam_conf("1.1.0", ranges=[[{"subnet": "10.68.0.0/24"}]])


@pytest.fixture
def etcd_in_node(node, make_etcd_auth):
    return make_etcd_auth(netns=node.name)


@pytest.fixture
def start_pycnid(node):
    """``start_pycnid(store_section)``: a pycnid in the node namespace (not yet waited for);
    stopped and its dir removed at teardown."""
    made: list[Pycnid] = []

    def start(store: dict) -> Pycnid:
        workdir = tempfile.mkdtemp(prefix="pycnid-auth-")
        config = daemon_config(workdir, store=store, metricsAddress=METRICS)
        daemon = Pycnid(node=node, workdir=workdir, config=config)
        made.append(daemon)
        return daemon

    yield start
    for daemon in made:
        daemon.stop()
        shutil.rmtree(daemon.workdir, ignore_errors=True)


def pycni_in(node, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`pycni ipam ARGS -o json` inside the node namespace (where etcd is)."""
    command = [sys.executable, "-m", "cli", "ipam", *args, "-o", "json"]
    env = {**os.environ, "PYTHONPATH": REPO}
    done = node.run(command, check=False, env=env)
    assert "Traceback" not in done.stderr, done.stderr
    assert not check or done.returncode == 0, done.stderr
    return done


def failed_start(daemon: Pycnid) -> str:
    """Start ``daemon``, which must exit 1: its log."""
    with pytest.raises(RuntimeError, match="pycnid exited 1"):
        daemon.start()
    log = daemon.log()
    assert "pycnid failed to start" in log, log
    return log


def test_pycnid_serves_with_its_user_and_shows_the_password_nowhere(
    cni_bin, node, etcd_in_node, start_pycnid, netns_factory
):
    users = etcd_in_node.users
    password = users.password(users.writer)
    daemon = start_pycnid(etcd_in_node.store_config(users.writer)).start()
    pod = netns_factory("pod")
    add = run_ipam(cni_bin, daemon, "ADD", CONF, cid="c1", netns=pod.path)
    assert add.ok, add.stdout + daemon.log()[-2000:]
    assert addresses(add.json) == ["10.68.0.2/24"]
    assert run_ipam(cni_bin, daemon, "STATUS", CONF).ok
    assert run_ipam(cni_bin, daemon, "DEL", CONF, cid="c1").ok
    assert run_ipam(cni_bin, daemon, "ADD", CONF, cid="c2", netns=pod.path).ok
    config = os.path.join(daemon.workdir, "pycnid.json")  # `pycni ipam` reads the same store
    shown = pycni_in(node, "show", "ipamnet/c2", "--config", config)
    assert [h["handle"] for h in json.loads(shown.stdout)["handles"]] == ["ipamnet/c2/eth0"]
    assert pycni_in(node, "show", "ipamnet/c1", "--config", config, check=False).returncode == 1

    metrics = node.run([sys.executable, "-c", SCRAPE % METRICS])
    assert parse_samples(metrics.stdout)  # the page was read
    pid = daemon.proc.pid  # `ip netns exec` execs pycnid: the same process
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        cmdline = fh.read()
    with open(f"/proc/{pid}/environ", "rb") as fh:
        environ = fh.read()
    ps = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
    assert b"pycnid.main" in cmdline and "pycnid.main" in ps
    for where, text in (
        ("pycnid's log", daemon.log()),
        ("the metrics", metrics.stdout),
        ("its command line", cmdline.decode()),
        ("its environment", environ.decode(errors="replace")),
        ("ps", ps),
        ("its config", Path(config).read_text()),
    ):
        assert password not in text, f"the password is in {where}"
    assert "authenticated as user 'pycni-node'" in daemon.log()  # the debug line names the user


def test_a_wrong_password_fails_the_start_naming_the_user(etcd_in_node, start_pycnid, tmp_path):
    wrong = tmp_path / "wrong.password"
    wrong.write_text("wrong-horse-battery\n")
    os.chmod(wrong, 0o600)
    store = etcd_in_node.store_config(etcd_in_node.users.writer, passwordFile=str(wrong))
    log = failed_start(start_pycnid(store))
    assert "authentication failed for user 'pycni-node'" in log and str(wrong) in log
    assert "wrong-horse-battery" not in log


def test_a_role_that_may_only_read_fails_the_start_naming_the_write(etcd_in_node, start_pycnid):
    store = etcd_in_node.store_config(etcd_in_node.users.reader)
    log = failed_start(start_pycnid(store))
    assert "permission denied to user 'pycni-reader' for the write under /pycni/v1/" in log


def test_a_client_certificate_etcd_does_not_trust_fails_the_start_naming_it(
    etcd_in_node, start_pycnid
):
    other = tempfile.mkdtemp(prefix="pycni-other-ca-")
    try:
        foreign = make_tls(other)
        store = etcd_in_node.store_config(
            etcd_in_node.users.writer, cert=foreign.client_cert, key=foreign.client_key
        )
        log = failed_start(start_pycnid(store))
    finally:
        shutil.rmtree(other, ignore_errors=True)
    assert f"etcd refused the client certificate {foreign.client_cert}" in log


def test_a_password_file_others_may_read_fails_the_start(etcd_in_node, start_pycnid, tmp_path):
    users = etcd_in_node.users
    loose = tmp_path / "loose.password"
    loose.write_text(users.password(users.writer))
    os.chmod(loose, 0o644)
    store = etcd_in_node.store_config(users.writer, passwordFile=str(loose))
    log = failed_start(start_pycnid(store))
    assert "'store.passwordFile'" in log and "mode 0644" in log
