"""A thread's netns inode (``kernel.ns.thread_netns_inode``: every nft call and node session
asks it) is read once between the thread's own switches: for generated sequences of entering
and leaving two namespaces, and of threads started wherever the test thread is, each answer
equals what /proc says of the asking thread at that moment. A thread started inside a pod's
netns is in it (threads inherit their creator's), and knows so."""

from __future__ import annotations

import os
import threading
from contextlib import ExitStack
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel import ns as kernel_ns
from kernel.ns import entered, thread_netns_inode

pytestmark = pytest.mark.netns

steps = st.lists(st.sampled_from(["enter a", "enter b", "leave", "ask", "thread"]), max_size=12)


def real_inode() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def ask_on_new_thread() -> tuple[int, int]:
    """(what a fresh thread is told, what /proc says of it), asked twice over."""
    out: list[tuple[int, int]] = []

    def body() -> None:
        out.extend((thread_netns_inode(), real_inode()) for _ in range(2))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert out[0] == out[1]
    return out[0]


def test_each_answer_is_the_asking_threads_netns(netns_factory) -> None:
    spaces = {name: netns_factory(name).path for name in ("a", "b")}
    home = real_inode()

    @settings(max_examples=60, deadline=None)
    @given(plan=steps)
    def check(plan: list[str]) -> None:
        with ExitStack() as inside:
            for step in plan:
                if step.startswith("enter"):
                    fd = os.open(spaces[step[-1]], os.O_RDONLY)
                    inside.callback(os.close, fd)
                    inside.enter_context(entered(fd))
                elif step == "leave":
                    inside.close()  # every switch undone, in reverse
                elif step == "ask":
                    assert thread_netns_inode() == real_inode()
                else:
                    told, actual = ask_on_new_thread()
                    assert told == actual == real_inode()
            assert thread_netns_inode() == real_inode()
        assert thread_netns_inode() == real_inode() == home

    check()


def test_between_switches_the_inode_is_read_once(netns_factory) -> None:
    path = netns_factory("a").path
    with mock.patch.object(kernel_ns.os, "stat", wraps=os.stat) as stat:

        def body() -> None:
            for _ in range(3):
                thread_netns_inode()
            fd = os.open(path, os.O_RDONLY)
            try:
                with entered(fd):
                    thread_netns_inode()
                    thread_netns_inode()
            finally:
                os.close(fd)
            thread_netns_inode()

        thread = threading.Thread(target=body)
        thread.start()
        thread.join()
    asked = [c for c in stat.call_args_list if c.args == ("/proc/thread-self/ns/net",)]
    assert len(asked) == 3  # at the thread's start, inside, and back home
