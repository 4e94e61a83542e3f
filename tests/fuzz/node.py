"""One node namespace with a real pycnid for a whole fuzz module, and how to talk to it.

``FuzzNode.exercise`` runs one generated case: snapshot the node, send, judge the reply,
read the log, compare the state (a refused request changes nothing; an accepted ADD is
deleted again and must leave nothing), then probe that pycnid still serves (a CHECK of the
``anchor`` attachment, which every case must leave intact).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import event

from store.keys import ENDPOINTS, HANDLES
from store.sqlite import SqliteStore
from tests.fixtures.bridge import host_local_ipam, masq_elements, pycni_ipam
from tests.fixtures.daemon import Pycnid, daemon_config, send_frame
from tests.fixtures.netns import Netns, new_netns

from .oracle import LogWatch, Verdict, judge_output
from .strategies import COMMANDS

HANG = 15.0  # seconds: a reply later than this is a hang, whatever the input
FUZZ_SUBNET = "10.91.0.0/24"
ANCHOR_SUBNET = "10.92.0.0/24"


@dataclass(frozen=True)
class State:
    """What a request can change on the node: links (bridges apart), nft elements, leases,
    endpoint records (key and revision: a rewrite with the same value is a change too)."""

    node_links: tuple
    pod_links: tuple
    elements: tuple
    leases: tuple
    endpoints: tuple


@dataclass
class FuzzNode:
    node: Netns
    pods: list[Netns]
    daemon: Pycnid
    cni_bin: str
    log: LogWatch
    anchor: dict = field(default_factory=dict)

    def __repr__(self) -> str:  # hypothesis prints the fixture with every falsifying example
        return f"FuzzNode({self.node.name}, log={self.daemon.log_path})"

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self))

    @property
    def socket(self) -> str:
        return self.daemon.socket

    @property
    def host_local_dir(self) -> str:
        return os.path.join(self.daemon.workdir, "host-local")

    # --- configs -----------------------------------------------------------------------

    def bridge_conf(
        self,
        version: str,
        ipam: str = "pycni-ipam",
        name: str = "fznet",
        bridge: str = "fz0",
        subnet: str = FUZZ_SUBNET,
    ) -> dict:
        ipam_conf = (
            pycni_ipam(subnet)
            if ipam == "pycni-ipam"
            else host_local_ipam(self.host_local_dir, subnet)
        )
        return {
            "cniVersion": version,
            "name": name,
            "type": "pycni-bridge",
            "bridge": bridge,
            "isGateway": True,
            "isDefaultGateway": True,
            "ipMasq": True,
            "ipam": ipam_conf,
        }

    def ipam_conf(self, version: str, name: str = "fzipam") -> dict:
        return {
            "cniVersion": version,
            "name": name,
            "type": "ptp",
            "ipam": {
                "type": "pycni-ipam",
                "ranges": [[{"subnet": "10.93.0.0/24"}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dns": {"nameservers": ["10.93.0.53"]},
            },
        }

    # --- talking to pycnid -----------------------------------------------------------------

    def send_frame(self, frame: bytes, fds: tuple[int, ...] = ()) -> bytes:
        """One raw frame (write side shut after it), the reply bytes; a hang fails the case."""
        return send_frame(self.socket, frame, fds, HANG)

    def request(
        self, plugin: str, env: dict[str, str], stdin: bytes, netns: str | None = None
    ) -> tuple[int, str]:
        """A request as the executable frames it (cni/spec/wire.py), with the netns fd."""
        blob = b"\0".join(f"{k}={v}".encode("utf-8", "surrogatepass") for k, v in env.items())
        head = b"PYCNI1 %s %d %d %d\n" % (plugin.encode(), len(blob), len(stdin), bool(netns))
        fd = os.open(netns, os.O_RDONLY) if netns else None
        try:
            reply = self.send_frame(head + blob + stdin, (fd,) if fd is not None else ())
        finally:
            if fd is not None:
                os.close(fd)
        head, sep, body = reply.partition(b"\n")
        assert sep and head.isdigit(), f"not a pycnid reply: {reply[:200]!r}"
        return int(head), body.decode("utf-8")

    def env(
        self, command: str, cid: str = "", ifname: str = "eth0", netns: str = "", args: str = ""
    ) -> dict[str, str]:
        env = {"CNI_COMMAND": command, "CNI_PATH": f"{self.cni_bin}:/usr/lib/cni"}
        if command in ("ADD", "DEL", "CHECK"):
            env.update(CNI_CONTAINERID=cid, CNI_IFNAME=ifname, CNI_NETNS=netns, CNI_ARGS=args)
        return env

    # --- state -------------------------------------------------------------------------

    def links(self, ns: Netns) -> list[dict]:
        return json.loads(ns.run(["ip", "-j", "-d", "link", "show"]).stdout)

    def bridges(self) -> set[str]:
        return {
            link["ifname"]
            for link in self.links(self.node)
            if link.get("linkinfo", {}).get("info_kind") == "bridge"
        }

    def snapshot(self) -> State:
        def describe(ns: Netns) -> tuple:
            return tuple(
                sorted(
                    (
                        link["ifname"],
                        link.get("linkinfo", {}).get("info_kind", ""),
                        link.get("ifalias", ""),
                    )
                    for link in self.links(ns)
                    if link.get("linkinfo", {}).get("info_kind") != "bridge"
                )
            )

        return State(
            node_links=describe(self.node),
            pod_links=tuple(describe(pod) for pod in self.pods),
            elements=tuple(masq_elements(self.node)),
            leases=tuple(self.leases()),
            endpoints=tuple(sorted(self.endpoints().items())),
        )

    def open_store(self) -> SqliteStore:
        return SqliteStore(self.daemon.config["store"]["path"])

    def endpoints(self) -> dict[str, tuple[int, bytes]]:
        """Every endpoint record pycnid's store holds: key -> (mod_revision, value)."""
        store = self.open_store()
        try:
            return {kv.key: (kv.mod_revision, kv.value) for kv in store.range(ENDPOINTS)}
        finally:
            store.close()

    def leases(self) -> list[str]:
        store = self.open_store()
        try:
            found = [kv.key for kv in store.range(HANDLES, keys_only=True)]
        finally:
            store.close()
        for root, _dirs, files in os.walk(self.host_local_dir):
            found += [
                os.path.join(root, f)
                for f in files
                if f != "lock" and not f.startswith("last_reserved_ip")
            ]
        return sorted(found)

    # --- one case ----------------------------------------------------------------------

    def exercise(
        self,
        command: str,
        send: Callable[[], tuple[int, str, str]],
        undo: Callable[[], tuple[int, str, str]] | None,
        stdin: bytes,
        context: str,
        accepted: Callable[[Verdict, State], None] | None = None,
    ) -> Verdict:
        """Run one case and check every invariant; ``accepted`` checks an accepted ADD (given
        the state before it) before ``undo`` deletes it."""
        before, bridges = self.snapshot(), self.bridges()
        self.log.new_lines()
        exit_code, stdout, stderr = send()
        verdict = judge_output(command, exit_code, stdout, stderr)
        event(
            f"{command if command in COMMANDS else 'odd command'} "
            + ("ok" if verdict.ok else f"code {verdict.value['code']}")
        )
        self.log.assert_no_stack(context)
        try:
            if verdict.ok and command == "ADD" and accepted is not None:
                accepted(verdict, before)
            if verdict.ok and command == "ADD" and undo is not None:
                del_exit, del_out, del_err = undo()
                assert del_exit == 0, f"DEL of an accepted ADD failed: {del_out} {del_err}"
                self.log.assert_no_stack(f"DEL after {context}")
            after = self.snapshot()
            assert after == before, f"{context} left state behind:\n{diff(before, after)}"
            self.check_new_bridges(bridges, stdin)
        finally:
            self.remove_new_bridges(bridges)
            if command == "ADD":
                self.remove_new_links(before)
        self.probe(context)
        return verdict

    def check_new_bridges(self, before: set[str], stdin: bytes) -> None:
        """A request may make the bridge its netconf names (bridges stay, as the reference's
        do), never another one."""
        try:
            conf = json.loads(stdin)
            named = conf.get("bridge", "pycni0") if isinstance(conf, dict) else None
        except (ValueError, RecursionError):
            named = None
        named = named if isinstance(named, str) else None
        made = self.bridges() - before
        assert made <= {named}, f"bridges {sorted(made)} made for a netconf naming {named!r}"

    def remove_new_bridges(self, before: set[str]) -> None:
        for name in self.bridges() - before:
            self.node.run(["ip", "link", "delete", name], check=False)

    def remove_new_links(self, before: State) -> None:
        """After a failed case: what it left in the pods and on the node, so the next case
        starts clean (the failure is reported anyway)."""
        for ns, old in [(self.node, before.node_links)] + list(
            zip(self.pods, before.pod_links, strict=True)
        ):
            names = {item[0] for item in old}
            for link in self.links(ns):
                if (
                    link["ifname"] not in names
                    and link.get("linkinfo", {}).get("info_kind") == "veth"
                ):
                    ns.run(["ip", "link", "delete", link["ifname"]], check=False)

    # --- the anchor: one live attachment every case must leave alone ------------------------

    def add_anchor(self) -> None:
        conf = self.bridge_conf("1.1.0", name="fzanchor", bridge="fza", subnet=ANCHOR_SUBNET)
        env = self.env("ADD", "fzanchor", "eth9", self.pods[0].path)
        exit_code, stdout = self.request(
            "bridge", env, json.dumps(conf).encode(), self.pods[0].path
        )
        assert exit_code == 0, f"anchor ADD failed: {stdout}"
        self.anchor = {"conf": conf, "result": json.loads(stdout)}

    def anchor_request(self, command: str, conf: dict) -> tuple[int, str]:
        return self.request(
            "bridge",
            self.env(command, "fzanchor", "eth9", self.pods[0].path),
            json.dumps(conf).encode(),
            self.pods[0].path,
        )

    def probe(self, context: str) -> None:
        conf = {**self.anchor["conf"], "prevResult": self.anchor["result"]}
        exit_code, stdout = self.anchor_request("CHECK", conf)
        assert (exit_code, stdout) == (0, ""), (
            f"after {context}: CHECK of the untouched anchor attachment failed: {stdout}"
        )


def diff(before: State, after: State) -> str:
    lines = []
    for name in State.__dataclass_fields__:
        old, new = getattr(before, name), getattr(after, name)
        if old != new:
            lines.append(f"{name}: before {old!r}\n{' ' * len(name)}  after  {new!r}")
    return "\n".join(lines)


def start_fuzz_node(cni_bin: str, pods: int = 1) -> FuzzNode:
    node = new_netns("fuzznode")
    made = [node]
    try:
        node.run("sysctl -qw net.ipv4.ip_forward=1")
        pod_ns = [new_netns("fuzzpod") for _ in range(pods)]
        made += pod_ns
        workdir = tempfile.mkdtemp(prefix="pycnid-fuzz-")
        daemon = Pycnid(
            node=node,
            workdir=workdir,
            config=daemon_config(workdir, faultInjection=False, logLevel="info"),
        )
        start_in(daemon, workdir)
    except BaseException:
        for ns in made:
            ns.delete()
        raise
    fz = FuzzNode(
        node=node, pods=pod_ns, daemon=daemon, cni_bin=cni_bin, log=LogWatch(daemon.log_path)
    )
    return fz


def start_in(daemon: Pycnid, workdir: str) -> None:
    """Start pycnid with its working directory in ``workdir``: a fuzzed relative path (a
    host-local dataDir, a socket) then lands there, not in the repository."""
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        daemon.start()
    finally:
        os.chdir(cwd)


def stop_fuzz_node(fz: FuzzNode) -> None:
    fz.daemon.stop()
    for ns in [*fz.pods, fz.node]:
        ns.delete()
    shutil.rmtree(fz.daemon.workdir, ignore_errors=True)


def new_cid() -> str:
    return "fz" + uuid.uuid4().hex[:12]


def run_exe(path: str, env: dict[bytes, bytes], stdin: bytes) -> tuple[int, str, str]:
    """An executable with an environment of bytes (os.environb semantics), hang-guarded."""
    try:
        proc = subprocess.run([path], input=stdin, env=env, capture_output=True, timeout=HANG)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"{os.path.basename(path)} did not exit within {HANG}s (env {env!r})"
        ) from None
    return (
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )
