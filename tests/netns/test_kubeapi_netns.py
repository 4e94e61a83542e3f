"""The fake API server (tests/fixtures/kubeapi.py) inside a network namespace, as the cluster
fixtures will run it on a control-plane host (cp0 on 172.31.250.2): it listens there and not in
the root namespace, the official client reaches it over HTTPS from inside that namespace, and
after ``stop`` it is dead there and ``start`` brings it back in the same namespace."""

from __future__ import annotations

import json
import os
import socket
from typing import cast

import pytest
import urllib3
from kubernetes import client, config

from tests.fixtures.etcd import run_in_netns
from tests.fixtures.kubeapi import FakeKubeAPI, namespace
from tests.fixtures.netns import Netns, sh

pytestmark = pytest.mark.netns
ADDRESS, PORT = "172.31.250.2", 6443


def listening(ss: list[str]) -> bool:
    """Whether ``ss`` (run in some namespace) shows a TCP listener on ADDRESS:PORT."""
    out = sh([*ss, "-Hltn", f"src {ADDRESS}:{PORT}"]).stdout
    return bool(out.strip())


def namespaces_seen(ns: Netns, kubeconfig: str) -> list[str]:
    """Namespace names listed by the official client from inside ``ns``."""

    def list_there() -> list[str]:
        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        with client.ApiClient(cfg) as api_client:
            resp = client.CoreV1Api(api_client).list_namespace(
                _preload_content=False, _request_timeout=(2.0, 3.0)
            )
            items = json.loads(cast(urllib3.HTTPResponse, resp).data)["items"]
            return [item["metadata"]["name"] for item in items]

    return run_in_netns(ns.name, list_there)


def refused_there(ns: Netns) -> bool:
    def connect() -> bool:
        try:
            socket.create_connection((ADDRESS, PORT), timeout=1).close()
        except ConnectionRefusedError:
            return True
        return False

    return run_in_netns(ns.name, connect)


def test_serves_inside_its_netns_and_restarts_there(netns_factory, tmp_path) -> None:
    cp = netns_factory("cp")
    cp.run(  # a veth pair with both ends inside: no dummy module on the test machines
        "ip link add cp0 type veth peer name cp0-peer && ip link set cp0-peer up && "
        f"ip addr add {ADDRESS}/24 dev cp0 && ip link set cp0 up"
    )
    api = FakeKubeAPI(netns=cp.name, host=ADDRESS, port=PORT, tls=True)
    try:
        api.start()
        api.put(namespace("default"))
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        assert api.url == f"https://{ADDRESS}:{PORT}"
        assert listening(["ip", "netns", "exec", cp.name, "ss"])
        assert not listening(["ss"])  # the root namespace has no such listener
        assert namespaces_seen(cp, kubeconfig) == ["default"]

        api.stop()
        assert not listening(["ip", "netns", "exec", cp.name, "ss"])
        assert refused_there(cp)

        api.start()
        assert listening(["ip", "netns", "exec", cp.name, "ss"])
        assert namespaces_seen(cp, kubeconfig) == ["default"]
    finally:
        certdir = os.path.dirname(api.ca_path or "")
        api.close()
    assert not os.path.exists(certdir)
