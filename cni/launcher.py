"""Write the plugin executables for a CNI bin dir (`make install`, tests, benchmarks).

Each is a three-line script run as `python -I -S` (isolated, no site import: the ~10 ms that
site-packages and .pth files cost are the difference between 1x and 2x a bare interpreter),
with the directory that holds the `cni` package put on sys.path explicitly.

    python -m cni.launcher /opt/cni/bin [--root DIR]

`--root` names the directory that will hold the `cni` package at run time (a staged
`make install DESTDIR=...` writes launchers for where the package will be, not where it is).
"""

from __future__ import annotations

import os
import sys

from cni.files import write_atomic

PLUGINS = ("bridge", "ipam", "svc")

TEMPLATE = """#!{python} -IS
import sys
sys.path.insert(0, {root!r})
from cni.exe import main
main({plugin!r})
"""


def package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def render_launcher(plugin: str, python: str | None = None, root: str | None = None) -> str:
    return TEMPLATE.format(
        python=python or os.path.realpath(sys.executable),
        root=root or package_root(),
        plugin=plugin,
    )


def write_launchers(dest: str, python: str | None = None, root: str | None = None) -> list[str]:
    os.makedirs(dest, exist_ok=True)
    written = []
    for plugin in PLUGINS:
        path = os.path.join(dest, f"pycni-{plugin}")
        write_atomic(path, render_launcher(plugin, python, root).encode(), 0o755)
        written.append(path)
    return written


if __name__ == "__main__":
    args = sys.argv[1:]
    root_arg = None
    if len(args) == 3 and args[1] == "--root":
        root_arg = args.pop()
        args.pop()
    if len(args) != 1:
        sys.exit("usage: python -m cni.launcher DEST_DIR [--root PACKAGE_PARENT_DIR]")
    for path in write_launchers(args[0], root=root_arg):
        print(path)
