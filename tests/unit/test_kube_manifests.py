"""conf/kubernetes/: the manifests parse, the ClusterRole grants list and watch on exactly the
kinds pycnid reads, the DaemonSet mounts every path the ConfigMap, the Secret and the installer
name (at the node paths the plugins use), and the ConfigMap's pycnid.json and conflist pass the
parsers pycnid and the plugins really use. Checked here, not yet on a live cluster."""

from __future__ import annotations

import functools
import json
import posixpath
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni.install import main as install_main
from cni.install import parse_args as install_args
from cni.runtime.conflist import conflist_from_bytes
from cni.spec.request import Env, Request
from cni.spec.wire import DEFAULT_SOCKET
from common.metrics import Registry
from kube.kinds import KINDS
from overlay.config import KNOWN as OVERLAY_KEYS
from plugins.bridge.config import parse_bridge_config
from plugins.ipam.config import parse_ipam_config
from pycnid.config import STORE_KEYS, parse_daemon_config
from pycnid.main import parse_args as pycnid_args
from pycnid.metrics_server import MetricsServer
from store.etcd_conn import parse_options

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "conf" / "kubernetes"
IMAGE = "ghcr.io/OWNER/pycni:0.1.0"
# What pycnid's Kubernetes source lists and watches (kube/kinds.py): (group, resource).
READ = {(kind.group, kind.resource) for kind in KINDS}
# pycnid's own keys (pycnid/config.py parse_daemon_config) and its sections' names.
DAEMON_KEYS = {"socket", "nodeName", "stateDir", "store", "metricsAddress", "logLevel",
               "workers", "receiveTimeout", "ipam", "nodeAddress", "nodeLabels", "overlay",
               "services", "kubernetes"}  # fmt: skip


@functools.cache  # read-only: no test changes a document
def documents() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(KUBE.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]


def one(kind: str) -> dict[str, Any]:
    found = [d for d in documents() if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def pod_spec() -> dict[str, Any]:
    return one("DaemonSet")["spec"]["template"]["spec"]


def container(name: str) -> dict[str, Any]:
    spec = pod_spec()
    found = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name]
    assert len(found) == 1, name
    return found[0]


def volume(name: str) -> dict[str, Any]:
    return next(v for v in pod_spec()["volumes"] if v["name"] == name)


def mount_of(c: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """The mount of container ``c`` holding ``path`` and the path's rest below it."""
    best = max(
        (m for m in c["volumeMounts"] if under(path, m["mountPath"])),
        key=lambda m: len(m["mountPath"]),
        default=None,
    )
    assert best is not None, f"{c['name']} mounts nothing holding {path}"
    return best, posixpath.relpath(path, best["mountPath"])


def under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def host_path_of(c: dict[str, Any], path: str) -> str:
    """The node's path that ``path`` in container ``c`` is (its mount must be a hostPath)."""
    mount, rest = mount_of(c, path)
    host = volume(mount["name"]).get("hostPath")
    assert host, f"{path} in {c['name']} is not on a hostPath volume"
    return posixpath.normpath(posixpath.join(host["path"], rest))


def configmap_file(c: dict[str, Any], path: str) -> str:
    """The ConfigMap key a file of container ``c`` is, checked to exist; its text."""
    mount, rest = mount_of(c, path)
    source = volume(mount["name"])["configMap"]["name"]
    cm = one("ConfigMap")
    assert cm["metadata"]["name"] == source
    assert rest in cm["data"], f"ConfigMap {source} has no key {rest}"
    return cm["data"][rest]


def daemon_json() -> dict[str, Any]:
    return json.loads(one("ConfigMap")["data"]["pycnid.json"])


def test_every_manifest_parses_and_lives_in_kube_system():
    docs = documents()
    assert {d["kind"] for d in docs} == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Secret", "DaemonSet"
    }  # fmt: skip
    for doc in docs:
        assert doc["apiVersion"] and doc["metadata"]["name"]
        if not doc["kind"].startswith("Cluster"):
            assert doc["metadata"]["namespace"] == "kube-system", doc["kind"]


def test_the_cluster_role_grants_list_and_watch_on_exactly_what_pycnid_reads():
    rules = one("ClusterRole")["rules"]
    granted = {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {(g, r, v) for g, r in READ for v in ("list", "watch")}
    for rule in rules:
        assert set(rule) == {"apiGroups", "resources", "verbs"}  # no nonResourceURLs, no names
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"]


def test_the_binding_gives_the_role_to_the_daemonsets_service_account():
    account, role, binding = one("ServiceAccount"), one("ClusterRole"), one("ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pycni", "namespace": "kube-system"}
    ]
    assert account["metadata"]["name"] == "pycni"
    assert pod_spec()["serviceAccountName"] == "pycni"


def test_the_pod_runs_on_every_node_in_the_nodes_network():
    spec = pod_spec()
    assert spec["hostNetwork"] is True and spec.get("hostPID", False) is False
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in spec["tolerations"]  # every taint, every effect
    assert container("pycnid")["securityContext"]["privileged"] is True
    assert not container("install-cni").get("securityContext", {}).get("privileged")
    assert {c["image"] for c in spec["initContainers"] + spec["containers"]} == {IMAGE}


def test_every_mount_names_a_volume_and_every_volume_is_used():
    spec = pod_spec()
    names = [v["name"] for v in spec["volumes"]]
    assert len(names) == len(set(names))
    used = {
        m["name"] for c in spec["initContainers"] + spec["containers"] for m in c["volumeMounts"]
    }
    assert used == set(names)
    secret = one("Secret")["metadata"]["name"]
    assert [v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v] == [secret]


def test_pycnid_runs_with_the_configmaps_config_and_the_downward_apis_node_name():
    pycnid = container("pycnid")
    assert pycnid["command"][0] == "pycnid"
    args = pycnid_args(pycnid["command"][1:])
    assert json.loads(configmap_file(pycnid, args.config)) == daemon_json()
    assert args.node_name == "$(NODE_NAME)"  # the kubelet expands it from the env below
    env = {e["name"]: e for e in pycnid["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["PYCNI_CONFIG"]["value"] == args.config
    assert {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} <= set(env)


def test_pycnid_json_parses_with_pycnids_own_parser():
    raw = daemon_json()
    assert set(raw) <= DAEMON_KEYS, set(raw) - DAEMON_KEYS
    assert "nodeName" not in raw  # --node-name gives it
    config = parse_daemon_config(raw)  # every section, as pycnid parses it at start
    assert config.store.type == "etcd" and config.store.endpoints
    assert set(raw["store"]) <= set(STORE_KEYS)
    parse_options(config.store.endpoints, config.store.ca, config.store.cert, config.store.key, {})
    assert config.overlay is not None and config.overlay.backend == "vxlan"
    assert set(raw["overlay"]) <= OVERLAY_KEYS
    assert config.proxy is not None  # services.proxy: true, kube-proxy removed
    assert config.kube is not None and config.kube.kubeconfig is None  # in-cluster


def test_the_store_credentials_are_the_secrets_files():
    pycnid = container("pycnid")
    secret = one("Secret")
    store = daemon_json()["store"]
    for key in ("ca", "cert", "key"):
        mount, rest = mount_of(pycnid, store[key])
        assert volume(mount["name"])["secret"]["secretName"] == secret["metadata"]["name"]
        assert rest in secret["stringData"] and "PLACEHOLDER" in secret["stringData"][rest]


def test_the_socket_and_state_dir_are_the_nodes_own_paths():
    """The plugins on the node find pycnid at the default socket (the conflist names none):
    it must be the same path on the node. The state dir (the outage journal) outlives the Pod."""
    pycnid = container("pycnid")
    raw = daemon_json()
    assert raw["socket"] == DEFAULT_SOCKET
    assert host_path_of(pycnid, raw["socket"]) == DEFAULT_SOCKET
    assert host_path_of(pycnid, raw["stateDir"]) == raw["stateDir"]


def test_the_probes_ask_the_metrics_endpoint_pycnid_serves():
    pycnid = container("pycnid")
    host, _, port = daemon_json()["metricsAddress"].rpartition(":")
    paths = set()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = pycnid[probe]["httpGet"]
        assert (get["host"], get["port"]) == (host, int(port)), probe
        paths.add(get["path"])
    server = MetricsServer(Registry(), "127.0.0.1:0").start()
    try:
        for path in paths:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as r:
                assert r.status == 200
    finally:
        server.stop()


def test_the_installer_writes_where_the_node_paths_are_mounted():
    install = container("install-cni")
    assert install["command"][:3] == ["python3", "-m", "cni.install"]
    args = install_args(install["command"][3:])
    configmap_file(install, args.conflist)
    for node_path in (args.bin_dir, args.conf_dir, args.lib_dir, args.python):
        inside = posixpath.join(args.host_root, node_path.lstrip("/"))
        assert host_path_of(install, inside) == node_path, node_path
    assert volume("host-python")["hostPath"]["type"] == "File"  # a node without it is named


def test_the_conflist_passes_the_runtime_and_plugin_parsers_and_installs(tmp_path):
    data = one("ConfigMap")["data"]["10-pycni.conflist"].encode()
    network = json.loads(data)
    assert conflist_from_bytes(data).name == network["name"]
    plugin = network["plugins"][0]
    assert plugin["type"] == "pycni-bridge" and "mtu" not in plugin  # the overlay's MTU
    request = Request(
        env=Env(command="ADD", container_id="c1", netns="/x", ifname="eth0", args={}),
        config={"cniVersion": network["cniVersion"], "name": network["name"], **plugin},
    )
    assert parse_bridge_config(request).has_ipam
    ipam = parse_ipam_config(request.config)
    assert ipam.pools == () and ipam.range_sets == ()  # the cluster pools that select the node
    source = tmp_path / "10-pycni.conflist"
    source.write_bytes(data)
    host = tmp_path / "host"
    (host / "usr" / "bin").mkdir(parents=True)
    (host / "usr" / "bin" / "python3").touch()
    assert install_main(["--conflist", str(source), "--host-root", str(host)]) == 0


@pytest.mark.parametrize(
    "package", ["nftables", "conntrack", "iproute2", "python3", "python3-pip"]
)
def test_the_image_has_what_pycnid_runs(package):
    dockerfile = (KUBE / "Dockerfile").read_text()
    assert "FROM debian:12-slim" in dockerfile
    assert f" {package} " in dockerfile.split("apt-get install", 1)[1].split("\n")[0] + " "
    assert '"/src[nft]"' in dockerfile  # pip install . with the libnftables binding


def test_the_readme_section_names_what_is_there():
    from cni.install import MARKER

    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Deploy on Kubernetes\n") :]
    section = section[: section.index("\n## ", 1)]
    for name in sorted(p.name for p in KUBE.iterdir() if not p.name.endswith(".dockerignore")):
        assert f"`{name}`" in section, name
    for word in (IMAGE, f'"{MARKER}"', "KUBERNETES_SERVICE_HOST", '"services": {"proxy": false}'):
        assert word in section, word
    assert "not yet been run on a live cluster" in section
