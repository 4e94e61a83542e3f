"""etcd store latency: CAS txn p50/p99 through pycni's adapter on loopback etcd (plain, mTLS,
3-member cluster), plus commits/s of 8 threads (one contended key, and 8 keys of their own).

Every etcd here is a throw-away member in a temp dir (tests/fixtures/etcd.py), removed at exit.

    python3 -m bench.etcd_txn [--ops N] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack

from store.base import Compare, Put
from store.etcd import EtcdStore
from tests.fixtures.etcd import EtcdCluster, EtcdServer, make_tls

from .common import percentile


def time_ms(fn: Callable[[], object], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def cas_once(store: EtcdStore, key: str, rev: list[int]) -> None:
    """One CAS round trip on a key whose mod_revision we hold (as the allocator does)."""
    result = store.txn([Compare(key, rev[0])], [Put(key, b"x" * 200)])
    assert result.succeeded
    rev[0] = result.revision


def measure_latency(store: EtcdStore, ops: int) -> dict:
    key, rev = f"/bench/cas-{time.monotonic_ns()}", [0]
    for _ in range(50):  # warm up channels and etcd
        cas_once(store, key, rev)
    cas = time_ms(lambda: cas_once(store, key, rev), ops)
    get = time_ms(lambda: store.get(key), ops)
    return {
        "cas_p50_ms": percentile(cas, 50),
        "cas_p99_ms": percentile(cas, 99),
        "get_p50_ms": percentile(get, 50),
        "get_p99_ms": percentile(get, 99),
        "n": ops,
    }


def contended_worker(store: EtcdStore, key: str, commits: int, conflicts: list) -> None:
    done = 0
    while done < commits:
        kv = store.get(key)
        value = str(int(kv.value) + 1).encode() if kv else b"1"
        if store.txn([Compare(key, kv.mod_revision if kv else 0)], [Put(key, value)]).succeeded:
            done += 1
        else:
            conflicts.append(1)


def measure_throughput(store: EtcdStore, threads: int, commits: int, shared: bool) -> dict:
    conflicts: list = []
    keys = [f"/bench/tp/{'shared' if shared else i}-{time.monotonic_ns()}" for i in range(threads)]
    workers = [
        threading.Thread(
            target=contended_worker,
            args=(store, keys[0] if shared else keys[i], commits, conflicts),
        )
        for i in range(threads)
    ]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    if shared:
        assert store.get(keys[0]).value == str(threads * commits).encode()  # no lost update
    return {
        "commits_per_s": threads * commits / elapsed,
        "conflicts": len(conflicts),
        "threads": threads,
    }


def run(ops: int) -> dict:
    results: dict = {}
    with ExitStack() as stack:
        plain = EtcdServer("benchplain")
        stack.callback(plain.cleanup)
        store = EtcdStore(plain.start().endpoints)
        stack.callback(store.close)
        results["plain"] = measure_latency(store, ops)
        results["contended_8_threads"] = measure_throughput(store, 8, 100, shared=True)
        results["independent_8_threads"] = measure_throughput(store, 8, 200, shared=False)

        certdir = tempfile.mkdtemp(prefix="pycni-bench-tls-")
        stack.callback(shutil.rmtree, certdir, True)
        tls = EtcdServer("benchtls", tls=make_tls(certdir))
        stack.callback(tls.cleanup)
        tstore = EtcdStore(
            tls.start().endpoints, ca=tls.tls.ca, cert=tls.tls.client_cert, key=tls.tls.client_key
        )
        stack.callback(tstore.close)
        results["mtls"] = measure_latency(tstore, ops)

        cluster = EtcdCluster(3)
        stack.callback(cluster.cleanup)
        cstore = EtcdStore(cluster.start().endpoints)
        stack.callback(cstore.close)
        results["cluster3"] = measure_latency(cstore, ops)
    return results


def render(results: dict) -> str:
    lines = [f"{'etcd 3.4 loopback':<24}{'CAS p50':>9}{'CAS p99':>9}{'get p50':>9}{'get p99':>9}"]
    for name in ("plain", "mtls", "cluster3"):
        r = results[name]
        lines.append(
            f"{name:<24}{r['cas_p50_ms']:>7.2f}ms{r['cas_p99_ms']:>7.2f}ms"
            f"{r['get_p50_ms']:>7.2f}ms{r['get_p99_ms']:>7.2f}ms"
        )
    for name in ("contended_8_threads", "independent_8_threads"):
        r = results[name]
        lines.append(
            f"{name:<24}{r['commits_per_s']:>8.0f} commits/s"
            f" ({r['conflicts']} CAS conflicts retried)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="sequential ops per latency row")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    results = run(args.ops)
    print(json.dumps(results, indent=2) if args.json else render(results))


if __name__ == "__main__":
    main()
