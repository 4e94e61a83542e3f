"""Where the API-fed proxy's first list -> programmed goes, in one process (no pycnid, no
netns): bench/svc_api.py's Services put into a fake API server on 127.0.0.1 (plain HTTP), then
pycnid's own code run step by step, one after the other (in pycnid the two kinds list at once,
on two threads): each kind's ``Reflector.relist`` through the real client (``kube/api.py``:
pages of 500, converted and handed to the proxy's sinks), the first full plan (``calc_plan``);
and the same Services as store records (``Records.replace_all``, as a restart reads etcd; the
records generated first) with their full plan: the anchor. The seconds the fake spent
answering (in this process) are given apart.

    python3 -m bench.svc_api_split [--services 10000] [--endpoints 5] [--profile 25]

``--profile N``: cProfile over each kind's relist, the N functions of most own time.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import threading
import time

from common.metrics import Registry
from kube.api import open_api
from kube.config import KubeConfig
from kube.kinds import ENDPOINT_SLICE, SERVICE
from kube.reflector import KubeMetrics, Reflector
from services.proxy.kube_source import ServiceSink, SliceSink
from services.proxy.view import Records

from .svc_api import BulkObjects, TimedKubeAPI
from .svc_e2e_memory import calc_kvs, full_plan, load


def fill_api(api: TimedKubeAPI, services: int, per_service: int) -> None:
    objects = BulkObjects(per_service)
    for i in range(services):
        api.put(objects.service_of(i))
        api.put(objects.slice_of(i))


def relist(api, reflector: Reflector, profile: int) -> dict:
    """One kind listed whole into its sink: seconds, of which the fake answering."""
    answered = len(api.lists)
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if profiler:
        profiler.runcall(reflector.relist)
    else:
        reflector.relist()
    row = {
        "step": f"relist {reflector.kind.resource}",
        "seconds": time.perf_counter() - started,
        "fake_answering": sum(took for _, took in api.lists[answered:]),
    }
    if profiler:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(profile)
    return row


def timed(step: str, fn, *args) -> dict:
    started = time.perf_counter()
    fn(*args)
    return {"step": step, "seconds": time.perf_counter() - started}


def measure(services: int, per_service: int, profile: int, kubeconfig: str) -> list[dict]:
    api = TimedKubeAPI().start()
    try:
        rows = [timed("put into the fake", fill_api, api, services, per_service)]
        client = open_api(KubeConfig(kubeconfig=api.write_kubeconfig(kubeconfig)))
        records, lock, wake = Records(), threading.Lock(), threading.Event()
        metrics, config = KubeMetrics(Registry()), KubeConfig()
        for kind, sink in (
            (SERVICE, ServiceSink(records, lock, wake)),
            (ENDPOINT_SLICE, SliceSink(records, lock, wake)),
        ):
            rows.append(relist(api, Reflector(client, kind, sink, config, metrics), profile))
    finally:
        api.close()
    rows.append(timed("full plan (API-fed records)", full_plan, records))
    store, kvs = Records(), calc_kvs(services, per_service)
    rows.append(timed("store records decoded and indexed", load, store, kvs))
    rows.append(timed("full plan (store-fed records)", full_plan, store))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.svc_api_split")
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pycni-split-") as tmp:
        kubeconfig = os.path.join(tmp, "kubeconfig")
        for row in measure(args.services, args.endpoints, args.profile, kubeconfig):
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
