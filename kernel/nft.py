"""Running nftables transactions: libnftables in-process, or `nft -f -` where it is missing.

One script is one atomic transaction. Output is read as JSON only (never parsed as text).
Commands must run in the node netns: a subprocess spawned by a thread that is inside a pod
netns (``ns.entered``) would program the pod, and a netlink socket opened there would stay
bound to it. ``Nft`` remembers the netns it was made in and refuses to run anywhere else.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from kernel.nftelem import (
    ElementBatch,
    ElementError,
    ElementSocket,
    calc_messages,
    dump_counters,
)
from kernel.ns import thread_netns_inode

log = logging.getLogger("pycnid.nft")
NFT_BINARY = "nft"
TIMEOUT = 30.0
#: From this size on (~1,500 elements) a script runs in a child ``nft -f -`` (``run_sized``):
#: the kept context keeps what it parsed, ~2 KiB an element, and pycnid's heap would keep it
#: after. Below it the kept context costs ~0.5 ms where a child costs ~15 ms.
APART_BYTES = 64 * 1024
NO_SUCH = "No such file or directory"  # what nft says of a table that is not there (ENOENT)


class NftError(Exception):
    """nft refused a transaction (nothing of it was applied)."""


class WrongNetns(RuntimeError):
    """An nft command was attempted from a thread that is not in the node netns."""


class Nft:
    """A serialised nftables engine bound to the netns it was created in."""

    def __init__(self, prefer_library: bool = True) -> None:
        self._lock = threading.Lock()
        self._home = thread_netns_inode()
        # nftables.Nftables contexts (the module has no type hints), or None: the nft binary
        self._ctx: Any
        self._json_ctx: Any
        self._ctx, self._json_ctx = _library_contexts() if prefer_library else (None, None)
        self.engine = "libnftables" if self._ctx else "nft -f -"
        self._elements: ElementSocket | None = None  # opened on first use, in this netns

    def run(self, script: str) -> None:
        """Apply ``script`` as one transaction; NftError with nft's message when refused."""
        if not script.strip():
            return
        self._guard()
        with self._lock:
            self._apply(self._ctx, script)

    def run_apart(self, script: str) -> None:
        """``run`` in a child ``nft -f -`` (the same libnftables): a large transaction's parse
        (~130 MiB at 70k elements) is then the child's, given back whole when it exits, never
        this process's heap. Without the binary, or its context: ``run``."""
        if self._ctx is None or shutil.which(NFT_BINARY) is None:
            return self.run(script)
        if not script.strip():
            return None
        self._guard()
        with self._lock:
            self._apply(None, script)
        return None

    def start_apart(self, script: str) -> Started:
        """``run_apart`` begun and not waited for: a child nft parses and applies ``script``
        on a thread of its own (a child process and a wait: it holds no interpreter) while
        the caller goes on, e.g. with the rest of a full render's plan on the other core.
        ``Started.wait`` ends it (NftError when refused); the thread holds the lock until the
        child is done, so a transaction asked for meanwhile comes after it. A script under
        ``APART_BYTES`` (a child costs ~15 ms, the kept context ~0.5), or without the binary:
        ``run``, done when this returns; refused, it is raised by ``wait`` all the same (the
        caller's plan goes on, and its run answers for the refusal)."""
        self._guard()
        if len(script) < APART_BYTES or shutil.which(NFT_BINARY) is None:
            try:
                self.run(script)
            except NftError as exc:
                return Started(None, [exc])
            return Started(None, [])

        def apply() -> None:
            with self._lock:
                self._apply(None, script)

        return _start(apply, "nft-apart")

    def run_elements(self, batch: ElementBatch) -> None:
        """A table's element changes as one netlink batch (kernel/nftelem.py):
        atomic as ``run``, but no libnftables cache refill (several ms beside thousands of
        sets). NftError with the kernel's reason when refused (nothing applied)."""
        self._guard()
        with self._lock:
            self._commit_elements(_encode_batch(batch))

    def run_then_elements(
        self,
        script: str,
        make: Callable[[], ElementBatch],
        beside: Callable[[], object] | None = None,
    ) -> None:
        """``run_sized(script)``, then ``run_elements(make())``: two transactions in that
        order, the batch made and encoded while the script is applied (a child nft, or
        libnftables' C code: neither holds the interpreter), so on a second core a full
        render's ~85k elements (~0.2 s of Python) no longer wait behind its declarations
        (~0.3 s). ``beside`` is called while the kernel takes the batch (~0.15 s within the
        send, which holds no interpreter either). The batch is not sent when the script is
        refused (NftError, as ``run``)."""
        self._guard()
        with self._lock:
            if script.strip():
                ctx = self._sized_context(script)
                messages = _beside(lambda: self._apply(ctx, script), lambda: _encode_batch(make()))
            else:
                messages = _encode_batch(make())
            if beside is None:
                self._commit_elements(messages)
            else:
                _beside(lambda: self._commit_elements(messages), beside)

    def _sized_context(self, script: str) -> Any:
        """Where ``run_sized`` runs ``script``: a child nft (None) from ``APART_BYTES`` on
        when the binary is there; else the kept context (None without the library: the
        binary too)."""
        apart = len(script) >= APART_BYTES and shutil.which(NFT_BINARY) is not None
        return None if apart else self._ctx

    def _apply(self, ctx: Any, script: str) -> None:
        """One script as one transaction (the caller holds the lock); NftError with nft's
        message when refused."""
        rc, _out, err = self._call(ctx, script, json_output=False)
        if rc != 0:
            raise NftError(err.strip() or f"nft exited {rc}")

    def _commit_elements(self, messages: list[tuple[int, bytes]]) -> None:
        try:
            if self._elements is None:
                self._elements = ElementSocket()
            self._elements.commit(messages)
        except (ElementError, OSError) as exc:
            raise NftError(f"element batch refused: {exc}") from exc

    def release_cache(self) -> None:
        """Give back what a large transaction left behind: libnftables keeps its cache in the
        context, which after a 120k-element render held 190 MiB. A fresh context starts with
        an empty one (the next command reads the declarations it needs), and glibc is asked to
        return the freed heap to the system."""
        if self._ctx is None:
            return
        self._guard()
        with self._lock:
            self._ctx = _library_contexts()[0] or self._ctx
        _trim_heap()

    def list_json(self, command: str, terse: bool = False) -> dict[str, Any]:
        """Run a `list ...` command and return its JSON document; ``terse``: without the
        elements of sets and maps, which libnftables then does not read at all (a non-terse
        `list sets` of the proxy's table at 10k Services left ~100 MiB in the context)."""
        self._guard()
        with self._lock:
            if self._json_ctx is not None:
                self._json_ctx.set_terse_output(terse)
            rc, out, err = self._call(self._json_ctx, command, json_output=True, terse=terse)
        return _listing(rc, out, err)

    def counters(self, family: str, table: str) -> dict[str, tuple[int, int]]:
        """The named counters of a table, {name: (packets, bytes)}, read over netlink
        (``nftelem.dump_counters``: the counters alone, no declaration read); {} without the
        table. NftError when the kernel refuses."""
        self._guard()
        try:
            return dump_counters(family, table)
        except (ElementError, OSError) as exc:
            raise NftError(f"counters of {table} not read: {exc}") from exc

    def _guard(self) -> None:
        if thread_netns_inode() != self._home:
            raise WrongNetns("nft called from a thread outside the node netns")

    @staticmethod
    def _call(
        ctx: Any, script: str, json_output: bool, terse: bool = False
    ) -> tuple[int, str, str]:
        if ctx is not None:
            return ctx.cmd(script)
        if json_output:  # a listing is one command, given as arguments: read from `-f -`,
            # nft (1.0.6) prints no JSON for it and exits 0 even for a table that is not there
            flags = ["-j", "-t"] if terse else ["-j"]
            argv = [NFT_BINARY, *flags, *script.split()]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
            return proc.returncode, proc.stdout, proc.stderr
        # the script from a memory file, not a pipe: ``input=`` is written PIPE_BUF (4 KiB)
        # a call, each taking the interpreter back, and a thread encoding beside it
        # (``run_then_elements``) held a 1.5 MiB script back as long as it ran
        with open(os.memfd_create("nft-script"), "w+b") as source:
            source.write(script.encode())
            source.seek(0)
            argv = [NFT_BINARY, "-f", "-"]
            proc = subprocess.run(
                argv, stdin=source, capture_output=True, text=True, timeout=TIMEOUT
            )
        return proc.returncode, proc.stdout, proc.stderr


class Started:
    """A transaction ``Nft.start_apart`` began."""

    def __init__(self, worker: threading.Thread | None, failure: list[BaseException]) -> None:
        self._worker, self._failure = worker, failure

    def wait(self) -> None:
        """Its end: NftError (or what else stopped it) when it was refused."""
        if self._worker is not None:
            self._worker.join()
        if self._failure:
            raise self._failure[0]


def run_sized(nft: Nft, script: str) -> None:
    """A script of ``APART_BYTES`` or more through ``run_apart`` (a large parse is then a
    child's heap, given back whole when it exits), a smaller one through ``run``; an empty
    one not at all. What the Service proxy and NetworkPolicy send their scripts with."""
    if script:
        (nft.run_apart if len(script) >= APART_BYTES else nft.run)(script)


_T = TypeVar("_T")


def _start(work: Callable[[], object], name: str) -> Started:
    """``work()`` begun on a thread of its own (in the netns of the thread that makes it:
    ``_guard``); its failure is kept for ``Started.wait``."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to whoever waits for it
            failure.append(exc)

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    return Started(worker, failure)


def _beside(background: Callable[[], object], foreground: Callable[[], _T]) -> _T:
    """``foreground()``'s result, ``background()`` run meanwhile on a thread (work that holds
    no interpreter for most of its time: nft's parse, the kernel's commit). Once both are
    done, the background's failure is raised (it is the transaction's), else the
    foreground's."""
    started = _start(background, "nft-beside")
    try:
        result = foreground()
    except BaseException:
        try:
            started.wait()
        except BaseException as failure:
            raise failure from None
        raise
    started.wait()
    return result


def _encode_batch(batch: ElementBatch) -> list[tuple[int, bytes]]:
    """A batch's messages; NftError when a value has no encoding (nothing sent)."""
    try:
        return calc_messages(
            batch.family, batch.table, batch.changes, batch.counters, batch.removals, batch.chains
        )
    except ElementError as exc:
        raise NftError(f"element batch refused: {exc}") from exc


def _listing(rc: int, out: str, err: str) -> dict[str, Any]:
    """A `list ...` command's answer as its JSON document; NftError with nft's message."""
    if rc != 0:
        raise NftError(err.strip() or f"nft exited {rc}")
    return json.loads(out) if out.strip() else {"nftables": []}


def _library_contexts() -> tuple[Any, Any]:
    """Two libnftables contexts (text in, JSON out), or (None, None) without the library."""
    try:
        import nftables  # pip-nftables / python3-nftables over libnftables.so.1

        ctx, json_ctx = nftables.Nftables(), nftables.Nftables()
    except (ImportError, OSError) as exc:
        log.info("libnftables unavailable (%s); using the nft binary", exc)
        return None, None
    json_ctx.set_json_output(True)
    return ctx, json_ctx


def _trim_heap() -> None:
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def table_exists(nft: Nft, family: str, name: str) -> bool:
    """Whether the kernel holds this table: a terse listing of it alone. `list tables` would
    answer too, but libnftables (1.0.6) reads every element of every table for it: with the
    proxy's table at 10k Services, ~100 MiB kept in the context and 1.5 s, for one name."""
    try:
        nft.list_json(f"list table {family} {name}", terse=True)
    except NftError as exc:
        if NO_SUCH in str(exc):
            return False
        raise
    return True
