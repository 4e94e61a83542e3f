"""The two sides of every comparison, each in its own node namespace.

pycni:     pycni-bridge + pycni-ipam launchers -> pycnid (SQLite store) in node namespace A
reference: /usr/lib/cni/bridge + host-local (dataDir in a temp dir), exec'd in node namespace B

Both drivers run inside their node namespace, so the bridge, veths and masquerade rules land
there; pods are fresh namespaces made beforehand (not timed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from .common import (
    REFERENCE_BIN,
    REPO,
    Sandbox,
    pycni_config,
    python_env,
    reference_config,
    sh,
    start_pycnid,
    stop_process,
    vm_rss_kib,
)


@dataclass
class Side:
    name: str
    node: str
    binary: str
    cni_path: str
    config: dict
    daemon: subprocess.Popen | None = None
    extra_env: dict | None = None

    def spec(self, pods: list[str], concurrency: int) -> dict:
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "CNI_PATH": self.cni_path,
            **(self.extra_env or {}),
        }
        return {
            "binary": self.binary,
            "config": self.config,
            "env": env,
            "pods": pods,
            "concurrency": concurrency,
            "daemon_pid": self.daemon.pid if self.daemon else None,
        }

    def drive(self, box: Sandbox, pods: list[str], concurrency: int) -> dict:
        """Run ADD-all then DEL-all for `pods` from inside this side's node namespace."""
        path = os.path.join(box.workdir, f"spec-{self.name}.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.spec(pods, concurrency), fh)
        proc = subprocess.run(
            ["ip", "netns", "exec", self.node, sys.executable, "-m", "bench.driver", path],
            capture_output=True,
            text=True,
            env=python_env(),
            cwd=REPO,
            timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{self.name} driver failed: {proc.stderr[-2000:]}")
        return json.loads(proc.stdout)

    def residue(self) -> dict:
        """Per-pod state left in the node namespace after every pod was deleted: veths, the
        reference's per-container iptables chains (CNI-…), pycni's masquerade set elements."""
        links = sh(["ip", "-n", self.node, "-o", "link", "show", "type", "veth"], check=False)
        nft = sh(["ip", "netns", "exec", self.node, "nft", "-j", "list", "ruleset"], check=False)
        objects = json.loads(nft.stdout or '{"nftables": []}')["nftables"]
        chains = [o["chain"] for o in objects if "chain" in o]
        cni_chains = [c for c in chains if c["name"].startswith("CNI-")]
        elements = sum(len(o["set"].get("elem", [])) for o in objects if "set" in o)
        return {
            "veths": len(links.stdout.splitlines()),
            "cni_chains": len(cni_chains),
            "set_elements": elements,
        }

    def rss_kib(self) -> int | None:
        return vm_rss_kib(self.daemon.pid) if self.daemon else None

    def stop(self) -> None:
        if self.daemon is not None:
            stop_process(self.daemon)


def pycni_side(box: Sandbox, masq: bool, bin_dir: str, tag: str = "") -> Side:
    node = box.netns(f"pycni-node{tag}")
    daemon, sock = start_pycnid(box, node, tag)
    return Side(
        "pycni",
        node,
        os.path.join(bin_dir, "pycni-bridge"),
        f"{bin_dir}:{REFERENCE_BIN}",
        pycni_config(masq),
        daemon,
        extra_env={"PYCNI_SOCKET": sock},
    )


def reference_side(box: Sandbox, masq: bool, tag: str = "") -> Side:
    node = box.netns(f"ref-node{tag}")
    data_dir = os.path.join(box.workdir, f"host-local{tag}")
    os.makedirs(data_dir, exist_ok=True)
    return Side(
        "reference",
        node,
        os.path.join(REFERENCE_BIN, "bridge"),
        REFERENCE_BIN,
        reference_config(data_dir, masq),
    )
