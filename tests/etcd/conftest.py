"""Fixtures for tests against a real etcd: servers, clusters, mTLS, and stores closed at teardown.

They come from tests/fixtures/etcd.py (``etcd_server``, ``etcd_shared``, ``etcd_cluster``,
``etcd_tls``, ``open_store``, ``store``), registered in tests/conftest.py."""
