"""The etcd fixture's picked ports: another process may bind one before the member does (a
parallel test's etcd), and that etcd's /health would then answer for this one. The first start
counts a member healthy only once its own process holds its client port, and moves to new
ports when it lost the race (tests/fixtures/etcd.py)."""

from __future__ import annotations

import pytest

from tests.fixtures.etcd import EtcdServer

pytestmark = pytest.mark.etcd


def test_a_member_whose_port_another_etcd_took_starts_on_new_ports():
    other = EtcdServer("other").start()
    ours = EtcdServer("ours")
    ours.client_port = other.client_port  # as if another process picked the same free port
    try:
        ours.start()
        assert ours.client_port != other.client_port
        assert ours.holds_client_port() and other.holds_client_port()
    finally:
        ours.cleanup()
        other.cleanup()
