"""The node netlink sessions pycni-bridge reuses per pycnid worker thread (kernel.session):
reused on one thread, never shared between threads, remade after a failure that is not a
kernel answer, bound to the netns they were made in, and closed at shutdown."""

from __future__ import annotations

import errno
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from pyroute2.netlink.exceptions import NetlinkError

from cni.spec.errors import InvalidConfig
from kernel.ns import entered
from kernel.session import NodeSessions


def in_netns(path: str, fn):
    """Run ``fn`` on a fresh thread that lives in the netns at ``path`` (and ends after)."""
    out: dict = {}

    def body() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            from kernel.ns import setns

            setns(fd)
            out["value"] = fn()
        except BaseException as exc:  # handed to the test thread
            out["error"] = exc
        finally:
            os.close(fd)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def lo_index(ipr) -> int:
    return ipr.link("get", ifname="lo")[0]["index"]


def test_one_thread_reuses_its_session_across_requests(netns_factory):
    ns = netns_factory("node")
    sessions = NodeSessions()

    def two_requests():
        with sessions.session() as first:
            lo_index(first)
        with sessions.session() as second:
            lo_index(second)
        return first, second

    first, second = in_netns(ns.path, two_requests)
    assert first is second
    sessions.close_all()
    assert first.status["closed"]


def test_threads_get_their_own_sessions_and_ended_threads_are_reaped(netns_factory):
    ns = netns_factory("node")
    sessions = NodeSessions()

    def one_request():
        with sessions.session() as ipr:
            assert lo_index(ipr) == 1
        return ipr

    a = in_netns(ns.path, one_request)
    b = in_netns(ns.path, one_request)  # a's thread has ended: its session is closed now
    assert a is not b
    assert a.status["closed"] and not b.status["closed"]
    sessions.close_all()
    assert b.status["closed"]


def test_kernel_and_cni_errors_keep_the_session_other_failures_replace_it(netns_factory):
    ns = netns_factory("node")
    sessions = NodeSessions()

    def requests():
        with pytest.raises(NetlinkError) as exc:
            with sessions.session() as ipr:
                ipr.link("get", ifname="no-such-link0")
        assert exc.value.code == errno.ENODEV
        with pytest.raises(InvalidConfig):
            with sessions.session() as again:
                raise InvalidConfig("policy said no")
        assert again is ipr
        with pytest.raises(OSError):
            with sessions.session() as same:
                raise OSError(errno.EBADF, "socket broke")
        with sessions.session() as fresh:
            lo_index(fresh)
        return ipr, same, fresh

    ipr, same, fresh = in_netns(ns.path, requests)
    assert same is ipr and ipr.status["closed"]
    assert fresh is not ipr and not fresh.status["closed"]
    sessions.close_all()


def test_session_belongs_to_the_netns_the_thread_is_in(netns_factory):
    """A thread that calls from another netns gets a session there, not its cached one."""
    node, pod = netns_factory("node"), netns_factory("pod")
    node.run("ip link add brsess0 type bridge")
    sessions = NodeSessions()

    def requests():
        with sessions.session() as home:
            assert home.link_lookup(ifname="brsess0")
        fd = os.open(pod.path, os.O_RDONLY)
        try:
            with entered(fd), sessions.session() as away:
                assert not away.link_lookup(ifname="brsess0")
        finally:
            os.close(fd)
        with sessions.session() as back:
            assert back.link_lookup(ifname="brsess0")
        return home, away

    home, away = in_netns(node.path, requests)
    assert away is not home
    sessions.close_all()


def test_a_pool_of_workers_serves_many_requests_with_one_session_each(netns_factory):
    ns = netns_factory("node")
    sessions = NodeSessions()

    def serve() -> list:
        def request(_: int):
            with sessions.session() as ipr:
                lo_index(ipr)
                return id(ipr)

        with ThreadPoolExecutor(4) as pool:  # threads start in the caller's (node) netns
            return list(pool.map(request, range(200)))

    used = in_netns(ns.path, serve)
    assert len(used) == 200 and len(set(used)) <= 4
    sessions.close_all()


def test_late_acks_do_not_pile_up_in_a_long_lived_session(netns_factory):
    """pyroute2 parks the ACK that follows a `link get` reply; the session drops those between
    requests, so a daemon-long session does not grow with every CHECK."""
    ns = netns_factory("node")
    sessions = NodeSessions()

    def requests() -> list[int]:
        parked = []
        for _ in range(50):
            with sessions.session() as ipr:
                lo_index(ipr)
                lo_index(ipr)
                parked.append(ipr.asyncore.msg_queue.root.qsize())
        return parked

    parked = in_netns(ns.path, requests)
    assert max(parked) <= 2  # only what this request's own calls left
    sessions.close_all()
