"""Write the demo's pycnid configs and network configs into a temp dir.

    python3 scripts/demo_config.py CONF_DIR WORK_DIR                  the single-node part
    python3 scripts/demo_config.py CONF_DIR NODE_DIR NODE ETCD_URL    a node of the two-node part

Single node: WORK_DIR/pycnid.json is conf/pycnid.json with the socket, state dir and SQLite
store in WORK_DIR; WORK_DIR/net.d/10-pycni.conflist is the example conflist.

A node of the two-node part: NODE_DIR/pycnid.json is conf/pycnid.json on the etcd at ETCD_URL
with the VXLAN overlay (every other overlay key at its default: VNI 1, UDP 4789, device
pycni.1, MTU underlay − 50) and the Service proxy on; NODE_DIR/net.d/20-pycni-cluster.conflist
is the example cluster conflist without its "mtu" (pycni-bridge then takes the overlay's: 1500
would not fit the tunnel), naming the backend it expects, with hairpinMode on and pycni-svc
chained right after pycni-bridge (as conf/30-pycni-svc.conflist does), so each Pod added is
published as a Service endpoint.

Every pycni plugin is pointed at its node's socket through its `daemonSocket` key, so the demo
never uses /run/pycni.
"""

from __future__ import annotations

import json
import os
import sys

CONFLIST = "10-pycni.conflist"
CLUSTER_CONFLIST = "20-pycni-cluster.conflist"
BACKEND = "vxlan"
SVC_PLUGIN = {"type": "pycni-svc"}


def render_daemon_config(example: dict, work: str) -> dict:
    return {
        **example,
        "socket": os.path.join(work, "pycnid.sock"),
        "stateDir": work,
        "nodeName": "demo-node",
        "store": {"type": "sqlite", "path": os.path.join(work, "store.db")},
    }


def render_node_config(example: dict, node_dir: str, node: str, etcd_url: str) -> dict:
    return {
        **example,
        "socket": os.path.join(node_dir, "pycnid.sock"),
        "stateDir": node_dir,
        "nodeName": node,
        "store": {"type": "etcd", "endpoints": [etcd_url]},
        "overlay": {"backend": BACKEND},
        "services": {"proxy": True},
    }


def render_conflist(example: dict, socket_path: str) -> dict:
    plugins = [
        dict(p, daemonSocket=socket_path) if str(p.get("type", "")).startswith("pycni-") else p
        for p in example["plugins"]
    ]
    return {**example, "plugins": plugins}


def render_overlay_conflist(example: dict, socket_path: str) -> dict:
    """The cluster conflist as an overlay node runs it: MTU from the node, backend named,
    hairpin on (a Pod reaching itself through its Service) and pycni-svc after the bridge."""

    def fit(plugin: dict) -> dict:
        if plugin.get("type") != "pycni-bridge":
            return plugin
        kept = {k: v for k, v in plugin.items() if k != "mtu"}
        return {**kept, "backend": {"type": BACKEND}, "hairpinMode": True}

    plugins = chain_svc([p for p in example["plugins"] if p.get("type") != SVC_PLUGIN["type"]])
    conflist = render_conflist({**example, "plugins": plugins}, socket_path)
    return {**conflist, "plugins": [fit(p) for p in conflist["plugins"]]}


def chain_svc(plugins: list[dict]) -> list[dict]:
    """pycni-svc right after the first pycni-bridge (last without one): it reads the Pod's
    addresses from that plugin's prevResult."""
    at = next(
        (i + 1 for i, p in enumerate(plugins) if p.get("type") == "pycni-bridge"), len(plugins)
    )
    return [*plugins[:at], dict(SVC_PLUGIN), *plugins[at:]]


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def write_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")


def setup_single_node(conf_dir: str, work: str) -> None:
    daemon = render_daemon_config(read_json(os.path.join(conf_dir, "pycnid.json")), work)
    conflist = render_conflist(read_json(os.path.join(conf_dir, CONFLIST)), daemon["socket"])
    write_json(os.path.join(work, "pycnid.json"), daemon)
    write_json(os.path.join(work, "net.d", CONFLIST), conflist)


def setup_overlay_node(conf_dir: str, node_dir: str, node: str, etcd_url: str) -> None:
    example = read_json(os.path.join(conf_dir, "pycnid.json"))
    daemon = render_node_config(example, node_dir, node, etcd_url)
    conflist = render_overlay_conflist(
        read_json(os.path.join(conf_dir, CLUSTER_CONFLIST)), daemon["socket"]
    )
    write_json(os.path.join(node_dir, "pycnid.json"), daemon)
    write_json(os.path.join(node_dir, "net.d", CLUSTER_CONFLIST), conflist)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        setup_single_node(sys.argv[1], sys.argv[2])
    elif len(sys.argv) == 5:
        setup_overlay_node(*sys.argv[1:])
    else:
        sys.exit("usage: demo_config.py CONF_DIR WORK_DIR | CONF_DIR NODE_DIR NODE ETCD_URL")
