"""Write the plugin executables for a CNI bin dir (`make install`, tests, benchmarks).

Each is a three-line script run as `python -I -S` (isolated, no site import: the ~10 ms that
site-packages and .pth files cost are the difference between 1x and 2x a bare interpreter),
with the directory that holds the `cni` package put on sys.path explicitly.

    python -m cni.launcher /opt/cni/bin
"""
from __future__ import annotations

import os
import sys

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
    return TEMPLATE.format(python=python or os.path.realpath(sys.executable),
                           root=root or package_root(), plugin=plugin)


def write_launchers(dest: str, python: str | None = None) -> list[str]:
    os.makedirs(dest, exist_ok=True)
    written = []
    for plugin in PLUGINS:
        path = os.path.join(dest, f"pycni-{plugin}")
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(render_launcher(plugin, python))
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        written.append(path)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m cni.launcher DEST_DIR")
    for path in write_launchers(sys.argv[1]):
        print(path)
