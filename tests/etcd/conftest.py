"""Fixtures for tests against a real etcd: servers, clusters, mTLS, and stores closed at teardown."""
from tests.fixtures.etcd import (etcd_cluster, etcd_server, etcd_shared,  # noqa: F401
                                 etcd_tls, open_etcd_store, shared_etcd_store)
