"""Fixtures for cluster-scale tests: namespaces on an underlay, etcd inside the control plane,
one pycnid per node namespace. Everything is removed at teardown, also after a failure."""

from __future__ import annotations

from tests.fixtures.cluster import make_cluster  # noqa: F401
