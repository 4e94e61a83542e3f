"""What a restarted pycnid does before it has programmed every Service (bench/svc_e2e.py), read
from outside without editing it: its proxy's log lines (it is restarted with ``logLevel`` info,
pycnid's default; the benchmark's nodes otherwise log warnings only), how many passes it made and
what each one did, and its memory: VmRSS sampled every 20 ms, VmHWM (the peak) and
``/proc/PID/smaps_rollup`` (anonymous vs file-backed) once programmed and 2 s later."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator

PROXY_LINE = re.compile(r"proxy: IPv(\d) table (rendered|updated), (\d+) Service")


class RssSampler:
    """VmRSS of ``pid`` every 20 ms on a thread: (seconds since start, KiB) pairs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.samples, self.stop = pid, [], threading.Event()
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.wait(0.02):
            status = read_status(self.pid)
            if "VmRSS" in status:
                self.samples.append((time.monotonic() - self.started, status["VmRSS"]))

    def close(self) -> list[tuple[float, int]]:
        self.stop.set()
        self.thread.join()
        return self.samples


def read_status(pid: int) -> dict[str, int]:
    """The kB fields of /proc/PID/status (VmRSS, VmHWM, RssAnon, RssFile ...)."""
    return read_kib_fields(f"/proc/{pid}/status")


def read_kib_fields(path: str) -> dict[str, int]:
    fields = {}
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB":
                    fields[name] = int(parts[0])
    except OSError:
        pass
    return fields


def calc_memory(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM and the smaps_rollup split of the process now (KiB)."""
    status, rollup = read_status(pid), read_kib_fields(f"/proc/{pid}/smaps_rollup")
    return {
        "VmRSS": status.get("VmRSS", 0),
        "VmHWM": status.get("VmHWM", 0),
        "Anonymous": rollup.get("Anonymous", 0),
        "RssFile": status.get("RssFile", 0),
    }


def read_log(log_text: str) -> Iterator[dict]:
    """pycnid's JSON-lines log, an entry a line (a line that is not JSON left out)."""
    for line in log_text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            yield entry


def parse_passes(log_text: str) -> list[dict]:
    """The proxy's committed transactions in pycnid's JSON-lines log: time, family, kind, size."""
    passes = []
    for entry in read_log(log_text):
        found = PROXY_LINE.search(str(entry.get("msg", "")))
        if found:
            passes.append(
                {
                    "ts": entry.get("ts"),
                    "family": int(found[1]),
                    "kind": found[2],
                    "services": int(found[3]),
                }
            )
    return passes


def calc_peak(samples: list[tuple[float, int]]) -> dict:
    """The sampled peak and when it was (s after exec), for the report."""
    if not samples:
        return {"rss_kib": None, "at": None}
    at, kib = max(samples, key=lambda s: s[1])
    return {"rss_kib": kib, "at": at}
