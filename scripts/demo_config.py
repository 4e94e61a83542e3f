"""Write the demo's pycnid config and network config into a temp dir.

    python3 scripts/demo_config.py CONF_DIR WORK_DIR

WORK_DIR/pycnid.json: conf/pycnid.json with the socket, state dir and SQLite store in WORK_DIR.
WORK_DIR/net.d/10-pycni.conflist: the example conflist, every pycni plugin pointed at that
socket through its `daemonSocket` key (so the demo never uses /run/pycni).
"""
from __future__ import annotations

import json
import os
import sys

CONFLIST = "10-pycni.conflist"


def render_daemon_config(example: dict, work: str) -> dict:
    return {**example, "socket": os.path.join(work, "pycnid.sock"), "stateDir": work,
            "nodeName": "demo-node",
            "store": {"type": "sqlite", "path": os.path.join(work, "store.db")}}


def render_conflist(example: dict, socket_path: str) -> dict:
    plugins = [dict(p, daemonSocket=socket_path) if str(p.get("type", "")).startswith("pycni-")
               else p for p in example["plugins"]]
    return {**example, "plugins": plugins}


def write_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")


def main(conf_dir: str, work: str) -> None:
    with open(os.path.join(conf_dir, "pycnid.json"), encoding="utf-8") as fh:
        daemon = render_daemon_config(json.load(fh), work)
    with open(os.path.join(conf_dir, CONFLIST), encoding="utf-8") as fh:
        conflist = render_conflist(json.load(fh), daemon["socket"])
    write_json(os.path.join(work, "pycnid.json"), daemon)
    write_json(os.path.join(work, "net.d", CONFLIST), conflist)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: demo_config.py CONF_DIR WORK_DIR")
    main(sys.argv[1], sys.argv[2])
