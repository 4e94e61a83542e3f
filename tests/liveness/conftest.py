"""Fixtures for node liveness, outage and reaper tests: real etcd, stores closed at teardown."""

from __future__ import annotations

from tests.fixtures.cluster import make_cluster  # noqa: F401
from tests.fixtures.etcd import (
    open_etcd_store,  # noqa: F401
    )
