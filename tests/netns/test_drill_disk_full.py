"""Drill: pycnid's state directory full, then read-only (SQLite store).

pycnid runs in a mount namespace of its own (``unshare -m``, private propagation) whose state
directory is a 1 MiB tmpfs, so filling it or remounting it read-only touches nothing of the
machine's. With the directory full, and then read-only, an ADD must either succeed whole or
fail with code 11 whose message names the cause, leaving nothing half-made (no veth, no
lease, no address in the Pod); once space (or write access) is back, ADDs succeed again with
no manual step, and every Pod added before keeps its address. Prints "N tried, N survived,
0 lost" (survived: all-or-nothing, and the service came back).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from store.keys import HANDLES
from store.sqlite import SqliteStore
from tests.fixtures.bridge import NETWORK, bridge_conf, new_cid, node_veths
from tests.fixtures.daemon import Pycnid, daemon_config
from tests.fixtures.netns import Netns
from tests.fixtures.plugins import run_plugin

pytestmark = [pytest.mark.netns, pytest.mark.drill]

SIZE = "1m"
IPAM = {"type": "pycni-ipam", "ranges": [[{"subnet": "10.84.0.0/24"}]]}
TRIES = 6  # ADDs in each broken state


class Node:
    def __init__(self, ns: Netns, pycnid: Pycnid, state: str, cni_bin: str, cni_path: str):
        self.ns, self.pycnid, self.state = ns, pycnid, state
        self.cni_bin, self.cni_path = cni_bin, cni_path

    def in_mounts(self, *cmd: str) -> subprocess.CompletedProcess:
        """``cmd`` in pycnid's mount namespace (where the tmpfs is)."""
        assert self.pycnid.proc is not None
        pid = str(self.pycnid.proc.pid)
        return subprocess.run(
            ["nsenter", "-t", pid, "-m", "--", *cmd], capture_output=True, text=True, timeout=30
        )

    def fill(self) -> None:
        self.in_mounts("sh", "-c", f"cat /dev/zero > {self.state}/fill; sync")

    def free(self) -> None:
        self.in_mounts("rm", "-f", f"{self.state}/fill")

    def add(self, pod: Netns, cid: str):
        return run_plugin(
            os.path.join(self.cni_bin, "pycni-bridge"),
            "ADD",
            bridge_conf(IPAM, bridge="fullbr0"),
            container_id=cid,
            netns=pod.path,
            cni_path=self.cni_path,
            socket=self.pycnid.socket,
        )

    def leases(self) -> int:
        """Handles in the store, read through pycnid's mount namespace's file (a copy)."""
        copy = tempfile.mkdtemp(prefix="pycni-full-copy-")
        try:
            for name in ("store.db", "store.db-wal", "store.db-shm"):
                self.in_mounts("sh", "-c", f"cat {self.state}/{name} > {copy}/{name} 2>/dev/null")
            store = SqliteStore(os.path.join(copy, "store.db"))
            try:
                return len(store.range(HANDLES, keys_only=True))
            finally:
                store.close()
        finally:
            shutil.rmtree(copy, ignore_errors=True)

    def veths(self) -> int:
        return len(node_veths(self.ns, NETWORK))


def small_state_dir(node: Netns, read_only: bool = False) -> tuple[Pycnid, str]:
    """A pycnid (not started) whose state directory is a 1 MiB tmpfs in a mount namespace
    of its own, mounted read-only when asked."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("needs unshare and nsenter (util-linux)")
    workdir = tempfile.mkdtemp(prefix="pycnid-full-")
    state = os.path.join(workdir, "state")
    os.makedirs(state)
    config = daemon_config(
        workdir, store={"type": "sqlite", "path": os.path.join(state, "store.db")}
    )
    config["stateDir"] = state
    options = f"size={SIZE}" + (",ro" if read_only else "")
    mount = 'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"'
    prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c", mount, "sh", options, state]
    return Pycnid(node=node, workdir=workdir, config=config, prefix=prefix), state


@pytest.fixture
def full_node(node: Netns, cni_bin: str, cni_path: str) -> Iterator[Node]:
    pycnid, state = small_state_dir(node)
    workdir = pycnid.workdir
    pycnid.start()
    try:
        yield Node(node, pycnid, state, cni_bin, cni_path)
    finally:
        pycnid.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_full_or_read_only_state_dir_fails_adds_whole_and_recovers(
    full_node: Node, netns_factory
) -> None:
    node = full_node
    live = []
    for _ in range(2):
        pod = netns_factory("fpod")
        assert node.add(pod, new_cid()).code == 0
        live.append(pod)
    tried = survived = refused = 0
    for break_it, mend_it, why in ((node.fill, node.free, "full"),):
        break_it()
        for _ in range(TRIES):
            tried += 1
            pod, leases, veths = netns_factory("fpod"), node.leases(), node.veths()
            res = node.add(pod, new_cid())
            if res.code == 0:
                live.append(pod)
                survived += node.leases() == leases + 1 and node.veths() == veths + 1
                continue
            refused += 1
            assert res.json["code"] == 11, f"{why}: {res.stdout}"
            msg = res.json["msg"] + " " + res.json.get("details", "")
            assert "full" in msg.lower(), msg
            assert "Traceback" not in res.stderr
            assert "eth0" not in pod.links(), f"{why}: a refused ADD left the Pod an interface"
            assert (node.leases(), node.veths()) == (leases, veths), f"{why}: half-made ADD"
            survived += 1
        mend_it()
        assert refused, f"state dir {why}: every ADD succeeded, nothing was tested"
        pod = netns_factory("fpod")
        again = node.add(pod, new_cid())
        assert again.code == 0, f"after the state dir was {why} no longer: {again.stdout}"
        live.append(pod)
    for pod in live:
        assert "eth0" in pod.links()
    print(f"\nstate dir full drill: {tried} tried, {survived} survived, 0 lost")
    assert survived == tried


def test_a_read_only_state_dir_stops_pycnid_at_start_naming_it(node: Netns) -> None:
    """A tmpfs cannot be remounted read-only while pycnid holds its files open for writing
    (the kernel answers EBUSY), so the read-only case is a state directory read-only from
    the start: pycnid exits 1 naming the store's path, never serves half-working."""
    pycnid, state = small_state_dir(node, read_only=True)
    try:
        with pytest.raises(RuntimeError, match="exited 1") as failed:
            pycnid.start()
        assert state in str(failed.value) and "Traceback" not in str(failed.value)
        assert "read-only" in str(failed.value).lower() or "readonly" in str(failed.value).lower()
    finally:
        pycnid.stop()
        shutil.rmtree(pycnid.workdir, ignore_errors=True)
