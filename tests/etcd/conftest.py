"""Fixtures for tests against a real etcd: servers, clusters, mTLS, and stores closed at teardown."""

from tests.fixtures.etcd import (
    etcd_shared,  # noqa: F401
    )
