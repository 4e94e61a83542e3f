"""Executable overhead: `pycni-bridge` VERSION vs a bare `python3 -I -S -c pass` (and Go bridge).

Interleaved rounds (one of each per round) so that machine noise hits all three alike; the
figure is the median wall time of fork+exec+exit as seen by the caller.

    python3 -m bench.exe_overhead [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from .common import REFERENCE_BIN, median, percentile, write_launchers

VERSION_ENV = {"CNI_COMMAND": "VERSION", "PATH": "/usr/bin:/bin"}


def time_exec(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        cmd,
        env=VERSION_ENV,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - start


def measure(bin_dir: str, rounds: int) -> dict:
    python = os.path.realpath(sys.executable)
    commands = {
        "python -I -S -c pass": [python, "-I", "-S", "-c", "pass"],
        "pycni-bridge VERSION": [os.path.join(bin_dir, "pycni-bridge")],
        "go bridge VERSION": [os.path.join(REFERENCE_BIN, "bridge")],
    }
    for cmd in commands.values():  # warm the page cache and __pycache__
        time_exec(cmd)
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, cmd in commands.items():
            samples[name].append(time_exec(cmd))
    return {
        name: {"median": median(vals), "p90": percentile(vals, 90), "n": len(vals)}
        for name, vals in samples.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pycni-bench-bin-") as tmp:
        result = measure(write_launchers(tmp), args.rounds)
    for name, stats in result.items():
        print(
            f"{name:24s} median {stats['median'] * 1e3:6.2f} ms   p90 {stats['p90'] * 1e3:6.2f} ms"
        )
    ratio = result["pycni-bridge VERSION"]["median"] / result["python -I -S -c pass"]["median"]
    print(f"ratio pycni/bare python: {ratio:.2f}x (goal <= 2.0x)")


if __name__ == "__main__":
    main()
