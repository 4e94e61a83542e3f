"""etcd with mTLS and user authentication (tests/fixtures/etcd.py ``enable_auth``: a writer and a
reader whose roles cover pycni's prefix and nothing else), the store opened as pycnid opens it
(the daemon config's ``store`` section): the writer leases, releases, watches and keeps leases;
a wrong password, a reader writing, a key outside the prefix are code 7 naming the cause; a token
etcd forgets (its TTL passed, or the member restarted) is renewed without the caller noticing,
and so is the token pycnid lacks when the cluster enables authentication after it started."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from cni.spec.errors import InvalidConfig, NotAvailable
from ipam.leases.service import LeaseService
from ipam.records import HandleId
from plugins.ipam.config import parse_ipam_config
from pycnid.config import parse_daemon_config
from store import open_store
from store.base import PREFIX, Compare, Put
from store.etcd import EtcdStore
from store.etcd_watch import WatchUpdate
from store.keys import HANDLES, handle_key
from tests.fixtures.etcd import AuthEtcd, enable_auth, turn_on_auth
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.etcd

V4 = parse_ipam_config(
    {"name": "net", "ipam": {"ranges": [[{"subnet": "10.22.0.0/16"}]]}}
).range_sets
HANDLE = HandleId("net", "c1", "eth0")
FAST = {"requestTimeout": 1.5, "statusTimeout": 1.0}
DROPPED = "deleted a simple token"  # etcd's info line when a token's TTL passed


@pytest.fixture
def opened() -> Callable[..., EtcdStore]:
    """``opened(store_section)``: the store pycnid would open from that section; closed at
    teardown."""
    stores: list[EtcdStore] = []

    def make(section: dict) -> EtcdStore:
        store = open_store(parse_daemon_config({"store": section}).store)
        assert isinstance(store, EtcdStore)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


class Events:
    """A watch callback that keeps (kind, key) of every event."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, update: WatchUpdate) -> None:
        self.seen.extend((event.kind, event.kv.key) for event in update.events)


def watch_handles(store: EtcdStore) -> Events:
    events = Events()
    watch = store.watch(HANDLES, 0, events)
    assert watch.wait_created(10)
    return events


def put(store: EtcdStore, key: str, value: bytes = b"1") -> None:
    kv = store.get(key)
    assert store.txn([Compare(key, kv.mod_revision if kv else 0)], [Put(key, value)]).succeeded


def test_the_writer_leases_releases_watches_and_keeps_a_lease(etcd_auth, opened):
    store = opened(etcd_auth.store_config(etcd_auth.users.writer))
    store.check_access()  # pycnid's start-up check
    store.status()
    events = watch_handles(store)
    leases = LeaseService(store, "node1")
    record, created = leases.acquire(HANDLE, V4, attributes={"pod": "web"})
    assert created and [ip.address for ip in record.ips] == ["10.22.0.2/16"]
    key = handle_key(str(HANDLE))
    wait_for("the watch to deliver the lease", lambda: ("put", key) in events.seen)
    assert leases.release(HANDLE) is not None
    wait_for("the watch to deliver the release", lambda: ("delete", key) in events.seen)
    beat = f"{PREFIX}heartbeats/node1"
    keeper = store.keep_lease(2, on_grant=lambda lease: put_with_lease(store, beat, lease))
    assert keeper.wait(10) and store.get(beat) is not None
    assert store.conn.credentials is not None
    assert store.conn.credentials.authentications == 1  # one token served all of it


def put_with_lease(store: EtcdStore, key: str, lease: int) -> None:
    assert store.txn([], [Put(key, b"alive", lease=lease)]).succeeded


def test_a_wrong_password_is_refused_naming_the_user(etcd_auth, opened, tmp_path):
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    os.chmod(wrong, 0o600)
    section = etcd_auth.store_config(etcd_auth.users.writer, passwordFile=str(wrong), **FAST)
    store = opened(section)
    for call in (lambda: store.get(f"{PREFIX}pools/p"), store.check_access):
        with pytest.raises(InvalidConfig) as err:
            call()
        assert err.value.code == 7
        assert "authentication failed for user 'pycni-node'" in err.value.msg
        assert str(wrong) in err.value.msg
        assert "invalid user ID or password" in err.value.details
        assert "not-the-password" not in str(err.value)
    with pytest.raises(NotAvailable) as status:  # STATUS: 50, and why
        store.status()
    assert "authentication failed for user 'pycni-node'" in status.value.msg


def test_a_reader_reads_but_its_writes_are_refused_naming_the_key(etcd_auth, opened):
    users = etcd_auth.users
    writer = opened(etcd_auth.store_config(users.writer))
    LeaseService(writer, "node1").acquire(HANDLE, V4)
    reader = opened(etcd_auth.store_config(users.reader, **FAST))
    assert [kv.key for kv in reader.range(HANDLES)] == [handle_key(str(HANDLE))]
    assert watch_handles(reader) is not None  # a watch needs read only
    with pytest.raises(InvalidConfig) as err:
        LeaseService(reader, "node2").acquire(HandleId("net", "c2", "eth0"), V4)
    assert err.value.code == 7
    assert "permission denied to user 'pycni-reader' for the txn writing /pycni/v1/" in (
        err.value.msg
    )
    assert "needs readwrite on /pycni/v1/" in err.value.msg
    with pytest.raises(InvalidConfig, match="permission denied .* for the write under /pycni/v1/"):
        reader.check_access()
    with pytest.raises(InvalidConfig, match="permission denied to user 'pycni-node' for the get"):
        writer.get("/registry/secrets")  # outside pycni's prefix: nobody here may read it


def test_an_expired_token_is_renewed_and_the_watch_keeps_delivering(make_etcd_auth, opened):
    etcd = make_etcd_auth(token_ttl=2)
    store = opened(etcd.store_config(etcd.users.writer))
    events = watch_handles(store)
    put(store, f"{HANDLES}a")
    credentials = store.conn.credentials
    assert credentials is not None
    first, before = credentials.token, credentials.authentications
    dropped = etcd.server.log().count(DROPPED)  # a slow machine may have dropped one already
    wait_for("etcd to drop the idle token", lambda: etcd.server.log().count(DROPPED) > dropped, 15)
    put(store, f"{HANDLES}b")  # refused once ("invalid auth token"), then served
    assert credentials.authentications > before and credentials.token != first
    wait_for("both events", lambda: {k for _, k in events.seen} >= {f"{HANDLES}a", f"{HANDLES}b"})


def test_a_restarted_member_forgets_tokens_and_pycni_authenticates_again(etcd_auth, opened):
    store = opened(etcd_auth.store_config(etcd_auth.users.writer))
    events = watch_handles(store)
    put(store, f"{HANDLES}before")
    etcd_auth.server.restart()  # simple tokens live in the member's memory
    put(store, f"{HANDLES}after")
    credentials = store.conn.credentials
    assert credentials is not None and credentials.authentications >= 2
    wait_for("the watch to resume", lambda: ("put", f"{HANDLES}after") in events.seen, 15)


def test_authentication_enabled_while_pycni_runs_is_followed(etcd_tls, opened, caplog):
    users = enable_auth(etcd_tls, etcd_tls.workdir, enable=False)
    store = opened(AuthEtcd(etcd_tls, users).store_config(users.writer))
    put(store, f"{HANDLES}open")  # no token: etcd has authentication disabled
    assert "has authentication disabled: store.username 'pycni-node' is not used" in caplog.text
    credentials = store.conn.credentials
    assert credentials is not None and credentials.token == ""
    turn_on_auth(etcd_tls)
    put(store, f"{HANDLES}closed")  # refused without a token, then authenticated
    assert credentials.token and credentials.authentications == 1
