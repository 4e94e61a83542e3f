"""The configs `make demo` writes (scripts/demo_config.py) are accepted by the parsers pycnid
and pycni-bridge really use: the single-node ones as before, and for each node of the two-node
part an etcd store with the VXLAN overlay and the Service proxy on, and a cluster conflist
whose bridge takes the overlay's MTU (the example's 1500 would be refused on a 1450-byte
tunnel), hairpins, and is followed by pycni-svc (each Pod is published as an endpoint)."""

from __future__ import annotations

import importlib.util
import json
import os
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from cni.runtime.conflist import conflist_from_bytes
from cni.spec.request import Env, Request
from overlay.config import parse_overlay_config
from plugins.bridge.config import parse_bridge_config
from plugins.bridge.overlay import fit_to_node
from plugins.ipam.config import parse_ipam_config
from pycnid.config import parse_daemon_config
from services.proxy.setup import parse_proxy_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONF = os.path.join(REPO, "conf")


def load_demo_config():
    spec = importlib.util.spec_from_file_location("demo_config", f"{REPO}/scripts/demo_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = load_demo_config()


def read(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def bridge_request(network: dict) -> Request:
    config = {
        "cniVersion": network["cniVersion"],
        "name": network["name"],
        **network["plugins"][0],
    }
    return Request(
        env=Env(command="ADD", container_id="c1", netns="/x", ifname="eth0", args={}),
        config=config,
    )


def test_single_node_configs_parse(tmp_path):
    demo.setup_single_node(CONF, str(tmp_path))
    daemon = parse_daemon_config(read(f"{tmp_path}/pycnid.json"))
    assert daemon.store.type == "sqlite" and daemon.socket == f"{tmp_path}/pycnid.sock"
    conflist_path = f"{tmp_path}/net.d/{demo.CONFLIST}"
    with open(conflist_path, "rb") as fh:
        assert conflist_from_bytes(fh.read(), conflist_path).name == "pycni"
    assert parse_bridge_config(bridge_request(read(conflist_path))).has_ipam


def test_overlay_node_configs_parse_and_fit_the_tunnel(tmp_path):
    node_dir = f"{tmp_path}/node1"
    demo.setup_overlay_node(CONF, node_dir, "node1", "http://172.31.251.2:2379")
    raw = read(f"{node_dir}/pycnid.json")
    daemon = parse_daemon_config(raw)
    assert daemon.store.type == "etcd"
    assert list(daemon.store.endpoints) == ["http://172.31.251.2:2379"]
    overlay = parse_overlay_config(raw)
    assert overlay is not None and overlay.backend == "vxlan"
    assert parse_proxy_config(raw) is not None
    conflist_path = f"{node_dir}/net.d/{demo.CLUSTER_CONFLIST}"
    with open(conflist_path, "rb") as fh:
        assert conflist_from_bytes(fh.read(), conflist_path).name == "pycni-cluster"
    network = read(conflist_path)
    cfg = parse_bridge_config(bridge_request(network))
    assert cfg.backend == "vxlan" and not cfg.mtu and cfg.hairpin
    assert [p["type"] for p in network["plugins"]] == ["pycni-bridge", "pycni-svc"]
    assert network["plugins"][1]["daemonSocket"] == f"{node_dir}/pycnid.sock"
    node = SimpleNamespace(backend="vxlan", mtu=1450)
    assert fit_to_node(cfg, node).mtu == 1450
    ipam = parse_ipam_config({"name": network["name"], "ipam": network["plugins"][0]["ipam"]})
    assert ipam.pools == ("pods-v4",)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8), st.integers() | st.text(max_size=8), max_size=5
    ),
    st.text(min_size=1, max_size=20),
    st.text(min_size=1, max_size=30),
)
def test_node_config_keeps_the_example_and_sets_what_the_demo_owns(example, node, url):
    """Whatever the example holds, the node's own keys win and every other key is kept."""
    rendered = demo.render_node_config(example, "/w/n", node, url)
    owned = {"socket", "stateDir", "nodeName", "store", "overlay", "services"}
    assert {k: v for k, v in rendered.items() if k not in owned} == {
        k: v for k, v in example.items() if k not in owned
    }
    assert rendered["nodeName"] == node and rendered["store"]["endpoints"] == [url]
    assert rendered["overlay"] == {"backend": "vxlan"}
    assert rendered["services"] == {"proxy": True}


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "type": st.sampled_from(
                    ["pycni-bridge", "portmap", "pycni-ipam", "pycni-svc", "tuning"]
                )
            },
            optional={"mtu": st.integers(576, 9000), "bridge": st.text(max_size=5)},
        ),
        max_size=4,
    )
)
def test_overlay_conflist_drops_the_bridge_mtu_and_chains_pycni_svc_once(plugins):
    """One pycni-svc, right after the first bridge (last without one); the bridge loses its
    mtu, names the backend and hairpins; every other plugin is as it was, in its order."""
    rendered = demo.render_overlay_conflist({"name": "n", "plugins": plugins}, "/s")["plugins"]
    types = [p["type"] for p in rendered]
    assert types.count("pycni-svc") == 1
    others = [p for p in plugins if p["type"] != "pycni-svc"]
    at = types.index("pycni-svc")
    assert at == next(
        (i + 1 for i, p in enumerate(others) if p["type"] == "pycni-bridge"), len(others)
    )
    assert rendered[at] == {"type": "pycni-svc", "daemonSocket": "/s"}
    for before, after in zip(others, rendered[:at] + rendered[at + 1 :], strict=True):
        if before["type"] == "pycni-bridge":
            assert "mtu" not in after and after["backend"] == {"type": "vxlan"}
            assert after["daemonSocket"] == "/s" and after["hairpinMode"] is True
            owned = ("backend", "daemonSocket", "hairpinMode")
            assert {k: v for k, v in after.items() if k not in owned} == {
                k: v for k, v in before.items() if k != "mtu"
            }
        elif before["type"].startswith("pycni-"):
            assert after == {**before, "daemonSocket": "/s"}
        else:
            assert after == before
