"""One benchmark client process of `bench.ipam_alloc` (one per node): ADD then DEL `count`
attachments with `concurrency` in flight, timing each call.

    python3 -m bench.ipam_worker '<json spec>'     (started by bench.ipam_alloc, not by hand)

Modes (spec["mode"]):
  lease   the daemon's allocation path in-process: ``LeaseService`` over ``EtcdStore`` (the
          allocator + one etcd txn per ADD). Runs inside the node namespace to reach etcd.
  socket  pycnid over its unix socket with ``cni.exe.run``: the executable's exact code (env
          check, netns fd over SCM_RIGHTS, wire framing) without a process spawn.
  exe     the real ``pycni-ipam`` executable, one process per call (for reference).

Protocol: prints "ready" once warmed up (channels open, pool cached, first block claimed) and
waits for a line on stdin; runs the ADDs, prints "added" and waits for a line again (so nodes
never DEL while another still ADDs); runs the DELs, prints one JSON line of results, exits.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

Op = Callable[[str], str | None]  # cid -> None (ok) or an error text


def lease_ops(spec: dict) -> tuple[Op, Op, Callable[[], None]]:
    from cni.spec.errors import CNIError
    from ipam.leases.service import LeaseService
    from ipam.records import HandleId
    from plugins.ipam.config import parse_ipam_config
    from store.etcd import EtcdStore

    store = EtcdStore(spec["endpoints"])
    leases = LeaseService(store, spec["node"])
    sets = parse_ipam_config(spec["netconf"]).range_sets
    network = spec["netconf"]["name"]

    def add(cid: str) -> str | None:
        try:
            leases.acquire(HandleId(network, cid, "eth0"), sets)
        except CNIError as err:
            return f"{err.code} {err.msg}"
        return None

    def delete(cid: str) -> str | None:
        try:
            leases.release(HandleId(network, cid, "eth0"))
        except CNIError as err:
            return f"{err.code} {err.msg}"
        return None

    return add, delete, store.close


def cni_env(spec: dict, command: str, cid: str) -> dict[str, str]:
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_IFNAME": "eth0",
        "CNI_NETNS": spec["netns"] if command == "ADD" else "",
        "CNI_ARGS": "",
        "CNI_PATH": spec["cni_bin"],
        "PYCNI_SOCKET": spec["socket"],
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }


def socket_ops(spec: dict) -> tuple[Op, Op, Callable[[], None]]:
    from cni import exe

    stdin = json.dumps(spec["netconf"]).encode()

    def call(command: str, cid: str) -> str | None:
        out, code = exe.run("ipam", cni_env(spec, command, cid), stdin)
        return None if code == 0 else out.strip()

    return (lambda cid: call("ADD", cid)), (lambda cid: call("DEL", cid)), (lambda: None)


def exe_ops(spec: dict) -> tuple[Op, Op, Callable[[], None]]:
    stdin = json.dumps(spec["netconf"]).encode()
    binary = os.path.join(spec["cni_bin"], "pycni-ipam")

    def call(command: str, cid: str) -> str | None:
        proc = subprocess.run(
            [binary], input=stdin, env=cni_env(spec, command, cid), capture_output=True, timeout=90
        )
        return None if proc.returncode == 0 else proc.stdout.decode().strip()

    return (lambda cid: call("ADD", cid)), (lambda cid: call("DEL", cid)), (lambda: None)


MODES = {"lease": lease_ops, "socket": socket_ops, "exe": exe_ops}


def timed_batch(op: Op, cids: list[str], concurrency: int) -> dict:
    """Run ``op`` over ``cids`` with ``concurrency`` threads; per-call ms, wall s, errors."""
    samples: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def one(cid: str) -> None:
        start = time.perf_counter()
        error = op(cid)
        elapsed = (time.perf_counter() - start) * 1000
        with lock:
            samples.append(elapsed)
            if error:
                errors.append(f"{cid}: {error}")

    started, cpu = time.perf_counter(), cpu_seconds()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, cids))
    return {
        "ms": samples,
        "wall": time.perf_counter() - started,
        "errors": errors[:20],
        "error_count": len(errors),
        "started": time.time() - (time.perf_counter() - started),
        "client_cpu": cpu_seconds() - cpu,
    }


def cpu_seconds() -> float:
    """CPU time of this process and of the children it waited for (the exe mode's spawns)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    spec = json.loads(sys.argv[1])
    add, delete, close = MODES[spec["mode"]](spec)
    prefix = f"{spec['node']}-{spec.get('tag', spec['mode'])}"
    warm = [f"{prefix}-warm{i}" for i in range(spec.get("warmup", 20))]
    cids = [f"{prefix}-{i}" for i in range(spec["count"])]
    try:
        timed_batch(add, warm, 1)
        print("ready", flush=True)
        sys.stdin.readline()
        result = {"add": timed_batch(add, cids, spec["concurrency"])}
        print("added", flush=True)
        sys.stdin.readline()
        result["del"] = timed_batch(delete, cids, spec["concurrency"])
        timed_batch(delete, warm, 1)
    finally:
        close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
