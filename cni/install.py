"""Install pycni's plugins on a node from a container: the DaemonSet's init container
(conf/kubernetes/daemonset.yaml). Standard library only: it runs before anything else.

    python3 -m cni.install --host-root /host --conflist /etc/pycni/config/10-pycni.conflist

Paths are the node's (``--bin-dir /opt/cni/bin``, ``--conf-dir /etc/cni/net.d``,
``--lib-dir /opt/pycni/lib``, ``--python /usr/bin/python3``), written under ``--host-root``
where the node's root is mounted. The container runtime execs the plugins on the node, not in
this image, so three things go there:

- the ``cni`` package (what the launchers import, standard library only) into
  ``<lib-dir>/cni-<digest>/``, a new directory renamed into place, so a plugin already running
  never sees a half-written package; the previous one is kept (the launchers being replaced may
  still be running from it), older ones are removed;
- the launchers of cni/launcher.py, run by the node's own python3 (which must exist);
- the conflist, with ``MARKER`` added, written to a temp file and renamed. A file of that name
  that is not ours (no ``MARKER``: another CNI's, or `make install`'s example) is never
  overwritten: the installer says so and exits 1, so the DaemonSet's Pod stays in its init
  container, where ``kubectl describe``/``logs`` show why, instead of pycnid running beside a
  network configuration nobody chose. Other files in the directory are left alone; one that
  sorts before ours is named in a warning (runtimes take the first file by name).

``MARKER`` is a top-level key of the list: the runtime passes a plugin only its own object with
``name`` and ``cniVersion`` (cni/runtime/conflist.py and cni/runtime/inject.py, which load lists
the way libcni does), so no plugin sees it.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass

from cni.files import write_atomic
from cni.launcher import PLUGINS, package_root, write_launchers
from cni.runtime.conflist import conflist_from_bytes
from cni.spec.errors import CNIError

MARKER = "pycniInstaller"
MARKER_TEXT = "written by cni.install (pycni's init container): edit the ConfigMap, not this file"
CONF_EXTENSIONS = (".conflist", ".conf", ".json")  # what runtimes read from the conf dir
LIB_PREFIX = "cni-"


class Refused(Exception):
    """The node holds something the installer must not replace (exit 1, message on stderr)."""


@dataclass(frozen=True)
class Target:
    host_root: str
    bin_dir: str
    conf_dir: str
    lib_dir: str
    python: str

    def on_host(self, path: str) -> str:
        """Where the node's ``path`` is inside this container."""
        return os.path.join(self.host_root, path.lstrip("/"))


def package_files(root: str) -> dict[str, bytes]:
    """The ``cni`` package's modules under ``root``, by path relative to ``root``."""
    files = {}
    for folder, dirs, names in os.walk(os.path.join(root, "cni")):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, "rb") as fh:
                files[os.path.relpath(path, root)] = fh.read()
    return files


def calc_digest(files: dict[str, bytes]) -> str:
    sha = hashlib.sha256()
    for rel in sorted(files):
        sha.update(rel.encode() + b"\0" + hashlib.sha256(files[rel]).digest())
    return sha.hexdigest()[:12]


def ensure_package(target: Target, files: dict[str, bytes]) -> str:
    """The node's path of the package copy (its parent dir goes on the launchers' sys.path)."""
    name = LIB_PREFIX + calc_digest(files)
    lib = target.on_host(target.lib_dir)
    final = os.path.join(lib, name)
    if not os.path.isdir(final):
        os.makedirs(lib, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".staging-", dir=lib)
        for rel, data in files.items():
            os.makedirs(os.path.join(staging, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(staging, rel), "wb") as fh:
                fh.write(data)
        os.chmod(staging, 0o755)
        os.rename(staging, final)
        say(f"wrote {final}")
    return os.path.join(target.lib_dir, name)


def launcher_root(path: str) -> str | None:
    """The package dir an existing launcher puts on sys.path (cni/launcher.py's TEMPLATE)."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        prefix = "sys.path.insert(0, "
        line = next(x for x in lines if x.startswith(prefix))
        value = ast.literal_eval(line[len(prefix) : -1])
    except (OSError, UnicodeDecodeError, StopIteration, ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def prune_packages(target: Target, keep: set[str]) -> None:
    """Remove the package copies (and failed stagings) no launcher points at any more."""
    lib = target.on_host(target.lib_dir)
    kept = {os.path.basename(p) for p in keep}
    for name in sorted(os.listdir(lib)):
        if name.startswith((LIB_PREFIX, ".staging-")) and name not in kept:
            shutil.rmtree(os.path.join(lib, name), ignore_errors=True)
            say(f"removed {os.path.join(lib, name)}")


def check_python(target: Target) -> None:
    python = target.on_host(target.python)
    if not os.path.lexists(python):  # lexists: a node's absolute symlink points outside here
        raise Refused(
            f"the node has no {target.python} (looked at {python}): the plugin launchers run "
            "on the node with its own python3 (--python names another)"
        )


def install_launchers(target: Target, root: str) -> None:
    for path in write_launchers(target.on_host(target.bin_dir), python=target.python, root=root):
        say(f"wrote {path}")


def render_conflist(data: bytes, source: str) -> bytes:
    """The conflist as installed: checked as the runtime loads it, with ``MARKER`` added."""
    conflist_from_bytes(data, source)  # a broken list fails here, not in the runtime
    doc = json.loads(data)
    doc[MARKER] = MARKER_TEXT
    return (json.dumps(doc, indent=2) + "\n").encode()


def is_ours(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and MARKER in doc


def read_or_none(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def conflist_path(target: Target, name: str) -> str:
    """Where ours goes; a foreign file of that name is refused (``Refused``)."""
    if not name or "/" in name or name.startswith("."):
        raise Refused(f"conflist name {name!r}: a plain file name is expected")
    path = os.path.join(target.on_host(target.conf_dir), name)
    if os.path.lexists(path) and not is_ours(path):
        raise Refused(
            f"{path} exists and was not written by cni.install (no {MARKER!r} key): left as it "
            "is. Move it away (or give pycni's conflist another name) and the installer "
            "writes pycni's"
        )
    return path


def ensure_conflist(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if read_or_none(path) == data:
        say(f"unchanged {path}")
        return
    write_atomic(path, data, 0o644, durable=True)
    say(f"wrote {path}")


def warn_about_earlier(conf_dir: str, name: str) -> None:
    for other in sorted(os.listdir(conf_dir)):
        if other < name and other.endswith(CONF_EXTENSIONS) and not other.startswith("."):
            say(
                f"warning: {os.path.join(conf_dir, other)} sorts before {name}: runtimes use the "
                "first file by name, so Pods get that network, not pycni's"
            )


def install(target: Target, conflist_source: str, name: str | None = None) -> None:
    """Refusals first, so a refused install changes nothing; the conflist last, because a
    runtime takes the node's network as ready once a conflist is there."""
    with open(conflist_source, "rb") as fh:
        conflist = render_conflist(fh.read(), conflist_source)
    name = name or os.path.basename(conflist_source)
    check_python(target)
    path = conflist_path(target, name)
    bin_dir = target.on_host(target.bin_dir)
    previous = launcher_root(os.path.join(bin_dir, f"pycni-{PLUGINS[0]}"))
    root = ensure_package(target, package_files(package_root()))
    install_launchers(target, root)
    prune_packages(target, {root} | ({previous} if previous else set()))
    ensure_conflist(path, conflist)
    warn_about_earlier(os.path.dirname(path), name)


def say(line: str) -> None:
    print(f"cni.install: {line}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python3 -m cni.install", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--conflist", required=True, help="the conflist to install (a file)")
    parser.add_argument(
        "--name", default=None, help="its file name on the node (default: the same)"
    )
    parser.add_argument("--host-root", default="/", help="where the node's / is mounted")
    parser.add_argument("--bin-dir", default="/opt/cni/bin")
    parser.add_argument("--conf-dir", default="/etc/cni/net.d")
    parser.add_argument("--lib-dir", default="/opt/pycni/lib", help="the cni package's copy")
    parser.add_argument("--python", default="/usr/bin/python3", help="the node's interpreter")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target = Target(args.host_root, args.bin_dir, args.conf_dir, args.lib_dir, args.python)
    try:
        install(target, args.conflist, args.name)
    except (Refused, CNIError, OSError) as exc:
        say(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
