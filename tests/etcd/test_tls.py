"""mTLS to etcd: CA + client cert connect; a missing client cert or a foreign CA is refused."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from cni.spec.errors import NotAvailable, TryAgainLater
from store.base import Compare, Put
from tests.fixtures.etcd import make_tls

pytestmark = pytest.mark.etcd

FAST = {"requestTimeout": 1.0, "statusTimeout": 0.5}


def test_mtls_connects_and_serves(etcd_tls, open_store):
    tls = etcd_tls.tls
    assert etcd_tls.endpoint.startswith("https://")
    store = open_store(etcd_tls.endpoints, ca=tls.ca, cert=tls.client_cert, key=tls.client_key)
    store.status()
    assert store.txn([Compare("/tls", 0)], [Put("/tls", b"ok")]).succeeded
    assert store.get("/tls").value == b"ok"


def test_without_client_cert_is_refused(etcd_tls, open_store):
    store = open_store(etcd_tls.endpoints, ca=etcd_tls.tls.ca, options=FAST)
    with pytest.raises(TryAgainLater) as err:
        store.get("/tls")
    assert etcd_tls.endpoint in err.value.msg
    with pytest.raises(NotAvailable):
        store.status()


def test_server_from_a_foreign_ca_is_refused(etcd_tls, open_store):
    other = tempfile.mkdtemp(prefix="pycni-other-ca-")
    try:
        foreign = make_tls(other)
        store = open_store(
            etcd_tls.endpoints,
            ca=foreign.ca,
            cert=foreign.client_cert,
            key=foreign.client_key,
            options=FAST,
        )
        with pytest.raises(TryAgainLater):
            store.get("/tls")
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_plain_http_to_a_tls_member_is_refused(etcd_tls, open_store):
    store = open_store([etcd_tls.endpoint.replace("https://", "http://")], options=FAST)
    with pytest.raises(TryAgainLater):
        store.get("/tls")


def test_tls_server_name_override(etcd_tls, open_store):
    """The cert names 127.0.0.1 and localhost: verifying "localhost" works, another name not."""
    tls = etcd_tls.tls
    files = {"ca": tls.ca, "cert": tls.client_cert, "key": tls.client_key}
    good = open_store(etcd_tls.endpoints, **files, options={"tlsServerName": "localhost"})
    assert good.txn([], [Put("/sni", b"1")]).succeeded
    bad = open_store(
        etcd_tls.endpoints, **files, options={"tlsServerName": "etcd.example", **FAST}
    )
    with pytest.raises(TryAgainLater):
        bad.get("/sni")
