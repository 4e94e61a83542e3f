"""Runs one side's ADDs and DELs from inside its node namespace and times each exec.

    ip netns exec NODE python3 -m bench.driver SPEC.json   -> JSON timings on stdout

SPEC: {"binary", "config", "env", "pods": [netns paths], "concurrency", "ifname"}. The plugin is
exec'd exactly as a runtime does (CNI_* env, netconf on stdin; DEL carries the ADD result as
prevResult, as libcni does). Timings are wall-clock seconds around each exec; the churn wall
time covers all ADDs (resp. DELs) at the given concurrency.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def brief(text: str) -> str:
    return " ".join(text.split())[:300]


def invoke(spec: dict, command: str, netns: str, stdin: bytes) -> tuple[float, int, str]:
    env = {**spec["env"], "CNI_COMMAND": command, "CNI_NETNS": netns,
           "CNI_CONTAINERID": "bench-" + os.path.basename(netns),
           "CNI_IFNAME": spec.get("ifname", "eth0"), "CNI_ARGS": ""}
    start = time.perf_counter()
    proc = subprocess.run([spec["binary"]], input=stdin, env=env, capture_output=True)
    elapsed = time.perf_counter() - start
    return elapsed, proc.returncode, proc.stdout.decode(errors="replace")


def add_one(spec: dict, netns: str) -> tuple[float, dict | None, str]:
    elapsed, code, out = invoke(spec, "ADD", netns, json.dumps(spec["config"]).encode())
    if code != 0:
        return elapsed, None, brief(out) or f"exit {code}"
    return elapsed, json.loads(out), ""


def del_one(spec: dict, netns: str, prev: dict | None) -> tuple[float, str]:
    config = dict(spec["config"])
    if prev is not None:
        config["prevResult"] = prev
    elapsed, code, out = invoke(spec, "DEL", netns, json.dumps(config).encode())
    return elapsed, ("" if code == 0 else brief(out) or f"exit {code}")


def run(spec: dict) -> dict:
    pods = spec["pods"]
    workers = int(spec.get("concurrency", 1))
    errors: list[str] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        start = time.perf_counter()
        adds = list(pool.map(lambda ns: add_one(spec, ns), pods))
        add_wall = time.perf_counter() - start
        start = time.perf_counter()
        dels = list(pool.map(lambda item: del_one(spec, item[0], item[1][1]), zip(pods, adds)))
        del_wall = time.perf_counter() - start
    errors += [f"ADD: {err}" for _, _, err in adds if err]
    errors += [f"DEL: {err}" for _, err in dels if err]
    ips = [ip["address"] for _, res, _ in adds if res for ip in res.get("ips", [])]
    return {"add": [t for t, res, _ in adds if res is not None],
            "del": [t for t, err in dels if not err],
            "add_wall": add_wall, "del_wall": del_wall, "pods": len(pods),
            "unique_ips": len(set(ips)), "ips": len(ips), "errors": errors[:5],
            "error_count": len(errors)}


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as fh:
        spec = json.load(fh)
    json.dump(run(spec), sys.stdout)


if __name__ == "__main__":
    main()
