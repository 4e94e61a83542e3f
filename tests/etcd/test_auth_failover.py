"""etcd user authentication across failover: a 3-member mTLS cluster with users
(``etcd_auth_cluster``), each member killed in turn and started again. A token is valid on every
member (etcd replicates simple tokens through raft), except on a member that restarted: it has
forgotten them all and answers "invalid auth token", and pycni authenticates again. Writes keep
working, none is refused for its credentials, and the watch delivers every one."""

from __future__ import annotations

import pytest

from store.base import PREFIX
from store.etcd_watch import WatchUpdate
from tests.etcd.test_failover import create_with_retry
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.etcd


def test_each_member_killed_in_turn_with_authentication(etcd_auth_cluster, open_store):
    cluster, users = etcd_auth_cluster
    tls = cluster.members[0].tls
    store = open_store(
        cluster.endpoints,
        ca=tls.ca,
        cert=tls.client_cert,
        key=tls.client_key,
        username=users.writer,
        password_file=users.password_file(users.writer),
    )
    seen: set[str] = set()

    def keep(update: WatchUpdate) -> None:
        seen.update(event.kv.key for event in update.events)

    assert store.watch(f"{PREFIX}fo/", 0, keep).wait_created(10)
    written = []
    for round_, victim in enumerate(cluster.members):
        victim.kill()  # one of them is the leader when it dies
        for i in range(10):
            key = f"{PREFIX}fo/{round_}/{i}"
            create_with_retry(store, key, key.encode(), seconds=10)
            written.append(key)
        victim.start()
    assert [kv.key for kv in store.range(f"{PREFIX}fo/")] == sorted(written)
    wait_for("the watch to deliver every write", lambda: seen >= set(written), 20)
    assert store.conn.credentials is not None and store.conn.credentials.authentications >= 1
    cluster.wait_healthy()
