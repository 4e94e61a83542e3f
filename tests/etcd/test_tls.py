"""mTLS to etcd: CA + client cert connect; a missing or foreign client certificate, a foreign CA
or a wrong server name is refused with code 7 naming the file or key to fix (gRPC itself only
says "Unwrap failed"; store/etcd_tls.py repeats the handshake to name it)."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from cni.spec.errors import InvalidConfig, NotAvailable, TryAgainLater
from store.base import Compare, Put
from tests.fixtures.etcd import make_tls

pytestmark = pytest.mark.etcd

FAST = {"requestTimeout": 1.0, "statusTimeout": 0.5}


@pytest.fixture
def foreign():
    """Certificates from another CA than the member's."""
    other = tempfile.mkdtemp(prefix="pycni-other-ca-")
    try:
        yield make_tls(other)
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_mtls_connects_and_serves(etcd_tls, open_store):
    tls = etcd_tls.tls
    assert etcd_tls.endpoint.startswith("https://")
    store = open_store(etcd_tls.endpoints, ca=tls.ca, cert=tls.client_cert, key=tls.client_key)
    store.status()
    assert store.txn([Compare("/tls", 0)], [Put("/tls", b"ok")]).succeeded
    assert store.get("/tls").value == b"ok"


def test_without_client_cert_is_refused(etcd_tls, open_store):
    store = open_store(etcd_tls.endpoints, ca=etcd_tls.tls.ca, options=FAST)
    with pytest.raises(InvalidConfig) as err:
        store.get("/tls")
    assert etcd_tls.endpoint in err.value.msg and "TLS handshake refused" in err.value.msg
    assert "requires a client certificate: set store.cert and store.key" in err.value.details
    with pytest.raises(NotAvailable) as status:
        store.status()
    assert "client certificate" in status.value.details


def test_a_client_certificate_from_a_foreign_ca_is_refused_naming_it(
    etcd_tls, open_store, foreign
):
    store = open_store(
        etcd_tls.endpoints,
        ca=etcd_tls.tls.ca,
        cert=foreign.client_cert,
        key=foreign.client_key,
        options=FAST,
    )
    with pytest.raises(InvalidConfig) as err:
        store.get("/tls")
    assert err.value.code == 7
    assert f"etcd refused the client certificate {foreign.client_cert}" in err.value.details
    assert "bad certificate" in err.value.details


def test_server_from_a_foreign_ca_is_refused(etcd_tls, open_store, foreign):
    store = open_store(
        etcd_tls.endpoints,
        ca=foreign.ca,
        cert=foreign.client_cert,
        key=foreign.client_key,
        options=FAST,
    )
    with pytest.raises(InvalidConfig) as err:
        store.get("/tls")
    assert f"not trusted by {foreign.ca} (store.ca)" in err.value.details


def test_a_key_that_is_not_the_certificates_is_refused_at_open(etcd_tls, open_store, foreign):
    with pytest.raises(InvalidConfig, match="'store.key'") as err:
        open_store(
            etcd_tls.endpoints,
            ca=etcd_tls.tls.ca,
            cert=etcd_tls.tls.client_cert,
            key=foreign.client_key,
        )
    assert f"{foreign.client_key} does not hold the private key of" in err.value.details


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
    with pytest.raises(InvalidConfig) as err:
        bad.get("/sni")
    assert "does not name 'etcd.example' (store.tlsServerName" in err.value.details
