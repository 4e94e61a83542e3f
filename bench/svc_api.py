"""`make bench-svc-api`: the Service proxy fed by the Kubernetes API server, against the same
proxy fed by the store, at 10,000 Services x 5 endpoints, in one run.

    python3 -m bench.svc_api [--services 10000] [--endpoints 5] [--updates 10]
                             [--timeout 900] [--results-dir DIR]

A 2-node vxlan cluster (bench/overlay_topo.py) and a fake API server (tests/fixtures/kubeapi.py)
on the control-plane host cp0, HTTPS on 172.31.250.2:6443, where kube-apiserver would run. The
same ClusterIP Services (bench/svc_e2e_load.py's bulk: port 80 -> 8080, ``--endpoints`` each)
go into both sources: into the fake as a Service and an EndpointSlice each (one of each built
with the official client's models, the rest copies of their dicts), into etcd as store records
(the store's txn, from inside node1). node1's pycnid follows the API (``kubernetes`` section),
node2's the store: the anchor, measured in the same run.

Both pycnids are stopped while the Services are written, then started one after the other
(logLevel info), each measured alone:

- start -> first list: node1's first list request in the fake's request log (``TimedKubeAPI``
  stamps it); node2's "Service proxy on" log line, logged right after its proxy loop started
  reading the store (that read is not visible from outside);
- first list -> programmed: to the proxy's "IPv4 table rendered" log line (pycnid's JSON log,
  ms stamps); on the way node1's two kinds "listed whole", the seconds the fake spent answering
  the list pages (this machine's CPU, in this process: a real apiserver serves them from its
  watch cache), and each node's first full pass and its plan ("pass of N dirty Service(s)");
- VmRSS and VmHWM once programmed, and VmRSS 2 s later;
- ``--updates`` times, one EndpointSlice changed (endpoint 0's address replaced, the endpoint
  now on node1) -> node1's kernel holds it; the same for a store endpoint record on node2 (the
  kept libnftables poller of bench/svc_e2e_kernel.py).

Goals (the issue's): list -> programmed <= 3 s, update p50 <= 20 ms, VmRSS API/store <= 1.3x.
Results: bench/results/svc-api-<time>.json and svc-api-latest.json, and a table. Only
namespaces this run creates are touched. Figures, never timed assertions.
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import copy
import functools
import os
import re
import sys
import time
import uuid

from services.from_kube import SERVICE_NAME
from services.record import ServiceSettings
from store.keys import SERVICES_META
from tests.fixtures.cluster import Cluster
from tests.fixtures.kube import wire
from tests.fixtures.kubeapi import FakeKubeAPI, endpoint_slice, service

from . import svc_e2e_cold as cold
from . import svc_e2e_kernel as kernel
from .common import Line, Sandbox, render_goal_table, run_sandboxed
from .overlay_topo import QUIET_DAEMON
from .svc_e2e import CIDR, add_scale_options, mib, ms, secs, verdict, write_bulk_from
from .svc_e2e_load import (
    METRICS,
    SYNTHETIC_NODE,
    calc_bulk_addresses,
    scrape,
    services_metric,
)

API_PORT = 6443
#: Both nodes' pycnid: the proxy (no full re-render while measuring), metrics, info logs (the
#: lines measured), no fault points; no overlay (the proxy does not use it; both alike).
DAEMON = {
    **QUIET_DAEMON,
    "logLevel": "info",
    "metricsAddress": METRICS,
    "services": {"proxy": True, "resyncInterval": 3600},
}
READY = {"ready": True, "serving": True, "terminating": False}
LISTED = re.compile(r"kube: (\w+) listed whole \((\d+)\)")
PASS = re.compile(r"proxy: pass of (\d+) dirty Service\(s\): ([\d.]+) ms \(plan ([\d.]+) ms\)")
PROXY_ON = "Service proxy on"
#: The issue's goals at 10k Services x 5 endpoints from the API server.
GOALS = {"list_s": 3.0, "update_ms": 20, "rss_ratio": 1.3}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.svc_api", description=__doc__.splitlines()[0])
    add_scale_options(parser, 10, "EndpointSlice (node1) and store endpoint (node2) changes")
    parser.add_argument(
        "--settle", type=float, default=2.0, help="seconds after programmed to read VmRSS again"
    )
    return parser.parse_args(argv)


# --- the API side --------------------------------------------------------------------------
class TimedKubeAPI(FakeKubeAPI):
    """The fake API server, and for each list request when it came (monotonic) and how long
    its answer took (a watch answers until its stream ends: not kept)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lists: list[tuple[float, float]] = []  # (arrived, seconds)

    def answer(self, handler) -> None:
        arrived = time.monotonic()
        super().answer(handler)
        if not wire.parse_bool("watch", wire.split_target(handler.path)[1].get("watch")):
            self.lists.append((arrived, time.monotonic() - arrived))


class BulkObjects:
    """The bulk Services as API objects: one Service and one EndpointSlice built with the
    official client's models, every other one a copy of their dicts (2 x 10^4 models take
    seconds to build)."""

    def __init__(self, per_service: int) -> None:
        self.per_service = per_service
        port = {"name": "", "port": 80, "target_port": 8080}
        self.service = service("bulk0", "s0", ["10.96.0.1"], [port], selector={"app": "s0"})
        endpoint = {"addresses": ["10.200.0.0"], "node_name": SYNTHETIC_NODE, "conditions": READY}
        self.slice = endpoint_slice(
            "bulk0", "s0-bulk", "s0", endpoints=[endpoint], ports=[{"name": "", "port": 8080}]
        )

    def service_of(self, i: int) -> dict:
        ns, vip, _ = calc_bulk_addresses(i, self.per_service)
        obj = copy.deepcopy(self.service)
        obj["metadata"].update(namespace=ns, name=f"s{i}", uid=str(uuid.uuid4()))
        obj["spec"].update(clusterIP=vip, clusterIPs=[vip], selector={"app": f"s{i}"})
        return obj

    def slice_of(self, i: int) -> dict:
        ns, _, ips = calc_bulk_addresses(i, self.per_service)
        obj = copy.deepcopy(self.slice)
        meta = {"namespace": ns, "name": f"s{i}-bulk", "uid": str(uuid.uuid4())}
        obj["metadata"].update(meta, labels={SERVICE_NAME: f"s{i}"})
        template = obj["endpoints"][0]
        obj["endpoints"] = [{**template, "addresses": [ip]} for ip in ips]
        return obj

    def moved_slice(self, i: int, ip: str, node: str) -> dict:
        """Service ``i``'s slice with endpoint 0 replaced by ``ip`` on ``node``."""
        obj = self.slice_of(i)
        obj["endpoints"][0] = {**obj["endpoints"][0], "addresses": [ip], "nodeName": node}
        return obj


def start_api(cluster: Cluster, kubeconfig: str) -> TimedKubeAPI:
    cp0 = cluster.etcd.hosts[0]
    api = TimedKubeAPI(netns=cp0.ns.name, host=cp0.address, port=API_PORT, tls=True)
    try:
        api.start().write_kubeconfig(kubeconfig)
    except BaseException:
        api.close()
        raise
    return api


# --- writing both sources ------------------------------------------------------------------
def load_sources(cluster: Cluster, api: TimedKubeAPI, services: int, per_service: int) -> dict:
    """Every bulk Service into the fake API server and into etcd; seconds each took."""
    started = time.monotonic()
    objects = BulkObjects(per_service)
    for i in range(services):
        api.put(objects.service_of(i))
        api.put(objects.slice_of(i))
    api_done = time.monotonic()
    first, last = write_bulk_from(cluster.nodes[0], cluster.etcd.endpoints, services, per_service)
    return {"api_put_seconds": api_done - started, "store_write_seconds": last - first}


# --- a node's start ------------------------------------------------------------------------
def parse_log(text: str) -> list[tuple[float, str]]:
    """pycnid's JSON-lines log as (wall-clock seconds, message)."""
    return [
        (wall_seconds(entry["ts"]), entry["msg"])
        for entry in cold.read_log(text)
        if isinstance(entry.get("ts"), str) and isinstance(entry.get("msg"), str)
    ]


def wall_seconds(ts: str) -> float:
    """'2026-12-02T01:20:29.123Z' as seconds since the epoch."""
    return calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) + float("0" + ts[19:-1])


def is_rendered(msg: str, want: int) -> bool:
    found = cold.PROXY_LINE.search(msg)
    return bool(found) and found[1] == "4" and found[2] == "rendered" and int(found[3]) >= want


def wait_rendered(node, offset: int, want: int, timeout: float) -> list[tuple[float, str]]:
    """The node's log lines since ``offset`` once its IPv4 table was rendered with ``want``
    Services and the pass that did it logged its time (as far as they came, after
    ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = parse_log(node.daemon.log()[offset:])
        if is_pass_logged(lines, want) or time.monotonic() >= deadline:
            return lines
        if node.daemon.proc.poll() is not None:
            raise RuntimeError(f"{node.name}'s pycnid exited: {node.daemon.log()[-2000:]}")
        time.sleep(0.05)


def is_pass_logged(lines: list[tuple[float, str]], want: int) -> bool:
    """The rendered line, then its pass's line (logged once the whole pass is done)."""
    msgs = [msg for _, msg in lines]
    done = next((n for n, msg in enumerate(msgs) if is_rendered(msg, want)), None)
    return done is not None and any(PASS.search(msg) for msg in msgs[done:])


def first_stamp(lines: list[tuple[float, str]], match) -> float | None:
    return next((wall for wall, msg in lines if match(msg)), None)


def measure_start(
    node, want: int, args: argparse.Namespace, api: TimedKubeAPI | None = None
) -> dict:
    """Start the node's pycnid with every Service in its source: see the module docstring."""
    offset = len(node.daemon.log())
    lag = time.time() - time.monotonic()  # wall clock -> monotonic, for the log's stamps
    started = time.monotonic()
    node.daemon.start(timeout=60)
    lines = wait_rendered(node, offset, want, args.timeout)
    memory = cold.calc_memory(node.daemon.proc.pid)
    programmed = first_stamp(lines, lambda msg: is_rendered(msg, want))
    proxy_on = first_stamp(lines, lambda msg: msg.startswith(PROXY_ON))
    lists = [(at, took) for at, took in api.lists if at >= started] if api else []
    # a list is logged once answered, and the two kinds list at once: the earliest arrival
    first_list = min(at for at, _ in lists) if lists else since(proxy_on, lag, 0.0)
    out = {
        "first_list_from": "the fake's request log" if api else "the 'Service proxy on' line",
        "start_to_first_list": None if first_list is None else first_list - started,
        "first_list_to_programmed": since(programmed, lag, first_list),
        "start_to_programmed": since(programmed, lag, started),
        "listed_whole": {
            found[1]: since(wall, lag, first_list)
            for wall, msg in lines
            if (found := LISTED.search(msg))
        },
        "fake_answering_lists": sum(took for _, took in lists),
        "list_requests": len(lists),
        "first_pass": calc_first_pass(lines),
        "programmed_metric": services_metric(scrape(node.host.ns.name)),
        "memory_programmed": memory,
    }
    time.sleep(args.settle)
    out["memory_settled"] = cold.calc_memory(node.daemon.proc.pid)
    return out


def since(wall: float | None, lag: float, start: float | None) -> float | None:
    """Seconds from ``start`` (monotonic) to a log stamp ``wall``."""
    return None if wall is None or start is None else wall - lag - start


def calc_first_pass(lines: list[tuple[float, str]]) -> dict | None:
    """The first full pass the proxy logged: dirty Services, its ms and its plan's ms."""
    for _, msg in lines:
        found = PASS.search(msg)
        if found:
            return {"services": int(found[1]), "ms": float(found[2]), "plan_ms": float(found[3])}
    return None


# --- one endpoint changed ------------------------------------------------------------------
def measure_api_updates(
    cluster: Cluster,
    api: TimedKubeAPI,
    services: int,
    per_service: int,
    count: int,
    timeout: float,
) -> dict:
    """``count`` EndpointSlices spread over the bulk: endpoint 0 moves to a new IP on node1
    (its hairpin element shows the transaction in node1's kernel)."""
    node, objects = cluster.nodes[0], BulkObjects(per_service)
    poller = kernel.start_poller(node)
    try:
        runs = []
        for r in range(count):
            ip = f"10.199.0.{r + 1}"
            moved = objects.moved_slice(services * (r + 1) // (count + 1), ip, node.name)
            runs.append(
                kernel.timed_change(poller, functools.partial(api.put, moved), ip, timeout)
            )
        return kernel.summarize(runs)
    finally:
        close_poller(poller)


def measure_store_updates(
    cluster: Cluster, services: int, per_service: int, count: int, timeout: float
) -> dict:
    """The anchor: the same on node2, a store endpoint record each (bench/svc_e2e_kernel.py)."""
    poller = kernel.start_poller(cluster.nodes[1])
    try:
        return kernel.measure_updates(cluster, poller, services, per_service, count, timeout)
    finally:
        close_poller(poller)


def close_poller(poller) -> None:
    poller.stdin.close()
    poller.wait(10)


# --- the run -------------------------------------------------------------------------------
def measure(args: argparse.Namespace, cluster: Cluster, api: TimedKubeAPI) -> dict:
    node_api, node_store = cluster.nodes
    cluster.etcd.put(SERVICES_META, ServiceSettings((CIDR,)).to_bytes())  # as bench-svc-e2e
    progress(f"writing {args.services} Services x {args.endpoints} endpoints to both sources")
    out = {"services": args.services, "endpoints_each": args.endpoints, "settle": args.settle}
    out.update(load_sources(cluster, api, args.services, args.endpoints))
    progress("node1 (API-fed) starting")
    out["api"] = measure_start(node_api, args.services, args, api)
    progress("node2 (store-fed) starting")
    out["store"] = measure_start(node_store, args.services, args)
    progress(f"{args.updates} endpoint changes on each node")
    sizes = (args.services, args.endpoints, args.updates, args.timeout)
    out["api"]["update"] = measure_api_updates(cluster, api, *sizes)
    out["store"]["update"] = measure_store_updates(cluster, *sizes)
    return out


def start_nodes(kubeconfig: str) -> Cluster:
    """etcd on cp0 and two nodes, not started yet: node1 with the ``kubernetes`` section."""
    cluster = Cluster.create(1)
    try:
        cluster.etcd.start()
        cluster.add_node(start=False, kubernetes={"kubeconfig": kubeconfig}, **DAEMON)
        cluster.add_node(start=False, **DAEMON)
    except BaseException:
        cluster.close()
        raise
    return cluster


def progress(text: str) -> None:
    print(f"--> {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def run(
    args: argparse.Namespace, box: Sandbox, _cni_bin: str, report: dict
) -> list[tuple[str, list[Line]]]:
    kubeconfig = os.path.join(box.workdir, "kubeconfig")
    progress("cluster starting")
    cluster = start_nodes(kubeconfig)
    with contextlib.ExitStack() as stack:
        stack.callback(close_cluster, cluster, report)
        api = start_api(cluster, kubeconfig)
        stack.callback(api.close)
        report["scale"] = measure(args, cluster, api)
    title = (
        f"{args.services} ClusterIP Services x {args.endpoints} endpoints: "
        "node1 from the API server, node2 from the store"
    )
    return [(title, scale_lines(report["scale"]))]


def close_cluster(cluster: Cluster, report: dict) -> None:
    underlay = cluster.underlay
    report["namespaces"] = [underlay.ns.name, *(h.ns.name for h in underlay.hosts)]
    cluster.close()


# --- report --------------------------------------------------------------------------------
def ratio(ours: float | None, anchor: float | None) -> float | None:
    return ours / anchor if ours and anchor else None


def times(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def pair(label: str, a: float | None, b: float | None, show) -> Line:
    """A line of both nodes' figures and their ratio, no goal."""
    return (label, show(a), show(b), times(ratio(a, b)), "", "")


def scale_lines(sc: dict) -> list[Line]:
    a, b = sc["api"], sc["store"]
    listed = max((v for v in a["listed_whole"].values() if v is not None), default=None)
    rss = ratio(a["memory_programmed"]["VmRSS"], b["memory_programmed"]["VmRSS"])
    update = (a["update"]["p50"], b["update"]["p50"])
    return [
        (
            "writing: API objects put / store txns",
            secs(sc["api_put_seconds"]),
            secs(sc["store_write_seconds"]),
            "",
            "",
            "",
        ),
        pair(
            "pycnid start -> first list (node2: proxy on)",
            a["start_to_first_list"],
            b["start_to_first_list"],
            secs,
        ),
        (
            *pair(
                "first list -> all programmed",
                a["first_list_to_programmed"],
                b["first_list_to_programmed"],
                secs,
            )[:4],
            f"<={GOALS['list_s']:g} s",
            verdict(a["first_list_to_programmed"], GOALS["list_s"]),
        ),
        ("  both kinds listed whole", secs(listed), "", "", "", ""),
        (
            f"  the fake answering {a['list_requests']} list pages (sum)",
            secs(a["fake_answering_lists"]),
            "",
            "",
            "",
            "",
        ),
        pair("  the first full pass", *pass_ms(a, b, "ms"), ms_or_dash),
        pair("    of which its plan", *pass_ms(a, b, "plan_ms"), ms_or_dash),
        pair(
            "pycnid start -> all programmed",
            a["start_to_programmed"],
            b["start_to_programmed"],
            secs,
        ),
        (
            "pycnid VmRSS once programmed",
            mib(a["memory_programmed"]["VmRSS"]),
            mib(b["memory_programmed"]["VmRSS"]),
            times(rss),
            f"<={GOALS['rss_ratio']:g}x",
            verdict(rss, GOALS["rss_ratio"]),
        ),
        pair(
            "  VmHWM then", a["memory_programmed"]["VmHWM"], b["memory_programmed"]["VmHWM"], mib
        ),
        pair(
            f"  VmRSS {sc['settle']:g} s later",
            a["memory_settled"]["VmRSS"],
            b["memory_settled"]["VmRSS"],
            mib,
        ),
        (
            *pair(
                f"one endpoint changed -> in the kernel, p50 of {len(a['update']['runs'])}",
                *update,
                ms,
            )[:4],
            f"<={GOALS['update_ms']} ms",
            verdict(update[0], GOALS["update_ms"] / 1000),
        ),
        pair("  max", a["update"]["max"], b["update"]["max"], ms),
        ("  timed out", str(a["update"]["timeouts"]), str(b["update"]["timeouts"]), "", "", ""),
    ]


def ms_or_dash(seconds: float | None) -> str:
    return "—" if seconds is None else ms(seconds)


def pass_ms(a: dict, b: dict, key: str) -> tuple[float | None, float | None]:
    """Both nodes' first full pass figure ``key``, in seconds (None: not logged)."""
    return tuple(  # type: ignore[return-value]
        None if n["first_pass"] is None else n["first_pass"][key] / 1000 for n in (a, b)
    )


def render(report: dict, sections: list[tuple[str, list[Line]]]) -> str:
    return render_goal_table("bench-svc-api", report, sections, "store-fed", (14, 14), "API-fed")


def main(argv: list[str] | None = None) -> int:
    return run_sandboxed("svc-api", parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
