"""Fixtures for node liveness, outage and reaper tests: real etcd, stores closed at teardown.

They come from tests/fixtures/etcd.py and tests/fixtures/cluster.py (``etcd_server``,
``etcd_shared``, ``open_store``, ``store``, ``make_cluster``), registered in tests/conftest.py."""
