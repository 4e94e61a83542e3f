"""Fixtures for cluster-scale tests: namespaces on an underlay, etcd inside the control plane,
one pycnid per node namespace. Everything is removed at teardown, also after a failure.

``make_cluster`` comes from tests/fixtures/cluster.py, registered in tests/conftest.py."""
