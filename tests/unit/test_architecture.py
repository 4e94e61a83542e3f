"""Folders are layers: the order below is the README's ``## Architecture`` tree, bottom to top.

Every import of every package (lazy ones inside functions and ``TYPE_CHECKING`` ones too,
parsed with ``ast``, nothing imported) goes down the list: to an entry on a lower layer, or
within its own entry. An entry on the same layer is a sibling, never imported. No two modules
import each other, however long the circle. The README's tree lists every package, nothing
that is gone, and its folders in this order.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Bottom to top. An entry is a package (its own modules and any sub-package not listed) or a
# module; a module belongs to the longest entry that names it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cni",),
    ("cni.spec",),
    ("cni.runtime",),
    ("cni.exe", "cni.launcher"),
    ("cni.install",),
    ("common",),
    ("kernel", "store", "kube"),
    ("ipam",),
    ("ipam.alloc",),
    ("ipam.leases",),
    ("ipam.outage",),
    ("ipam.ops",),
    ("nodes", "masq"),
    ("services",),
    ("services.proxy",),
    ("services.ops", "netpol", "overlay"),
    ("netpol.ops",),
    ("doctor",),
    ("plugins",),
    ("plugins.ipam", "plugins.svc"),
    ("plugins.bridge",),
    ("pycnid",),
    ("cli",),
)
TOPS = tuple(dict.fromkeys(entry.split(".")[0] for layer in LAYERS for entry in layer))
# A tree line: indent, then one entry or several siblings (``name/`` or ``name.py``) two
# spaces apart, then the description.
ENTRY = re.compile(r"^( *)((?:\S+(?:/|\.py))(?:  +\S+/)*)(?:\s|$)")


def architecture_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Architecture\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def tree_block() -> list[str]:
    """The code block of the section that holds the tree (it starts with ``cni/``)."""
    blocks = architecture_section().split("```")[1::2]
    return next(b for b in blocks if b.lstrip("\n").startswith("cni/")).splitlines()


def tree_entries() -> list[str]:
    """Every folder and module of the tree, as a path from the root, in the tree's order."""
    stack: list[str] = []
    paths: list[str] = []
    for line in tree_block():
        match = ENTRY.match(line)
        if match is None or len(match.group(1)) % 2:
            continue
        depth = len(match.group(1)) // 2
        if depth > len(stack):  # a continuation line, not an entry
            continue
        names = [name.rstrip("/") for name in match.group(2).split()]
        stack[depth:] = [names[0]]
        paths.extend("/".join(stack[:depth] + [name]) for name in names)
    return paths


def packages() -> set[str]:
    return {
        str(init.parent.relative_to(ROOT))
        for top in TOPS
        for init in (ROOT / top).rglob("__init__.py")
    }


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                yield f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def entry_of(module: str) -> tuple[int, str]:
    """The layer index and the entry a module belongs to (the longest entry naming it)."""
    found = [(len(e), i, e) for i, layer in enumerate(LAYERS) for e in layer if within(module, e)]
    assert found, f"{module} is in no layer: add it to LAYERS and the README's tree"
    _, index, entry = max(found)
    return index, entry


def forbidden(importer: str, target: str) -> str | None:
    """Why ``importer`` may not import ``target``; None when it may."""
    (low, mine), (high, theirs) = entry_of(importer), entry_of(target)
    if mine == theirs or high < low:
        return None
    if high == low:
        return f"{theirs} is a sibling of {mine} (same layer)"
    return f"{theirs} is above {mine}"


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports."""
    return {
        module_name(path): {t for t in imported(path) if t.split(".")[0] in TOPS}
        for top in TOPS
        for path in sorted((ROOT / top).rglob("*.py"))
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, targets = work[-1]
            target = next((t for t in targets if t in graph), None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = stack[stack.index(node) :]
                    del stack[stack.index(node) :]
                    if len(component) > 1:
                        found.append(sorted(component))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                work.append((target, iter(sorted(graph[target]))))
            elif target in stack:
                low[node] = min(low[node], index[target])
    return found


def test_every_package_is_in_the_architecture_tree():
    missing = packages() - set(tree_entries())
    assert not missing, f"README ## Architecture does not list {sorted(missing)}"


def test_everything_the_tree_lists_exists():
    gone = sorted(p for p in tree_entries() if not (ROOT / p).exists())
    assert not gone, f"README ## Architecture lists what is not there: {gone}"


def test_the_tree_lists_the_layers_in_order():
    listed = [p.removesuffix(".py").replace("/", ".") for p in tree_entries()]
    layered = [e for e in listed if any(e in layer for layer in LAYERS)]
    order = [entry_of(e)[0] for e in layered]
    assert order == sorted(order), f"the tree's folders out of layer order: {layered}"
    assert set(layered) == {e for layer in LAYERS for e in layer}


def test_the_section_states_the_request_path_and_the_rule():
    section = architecture_section()
    for step in (
        "cni/exe.py",
        "unix socket",
        "server",
        "dispatch",
        "handler",
        "netlink",
        "nftables",
        "store",
        "dependency rule",
    ):
        assert step in section, step


def test_imports_go_down_the_layers():
    found = sorted(
        (a, b, why)
        for a, targets in import_graph().items()
        for b in targets
        if (why := forbidden(a, b))
    )
    assert not found, "\n".join(f"{a} imports {b}: {why}" for a, b, why in found)


def test_no_modules_import_each_other():
    assert not cycles(import_graph())


def test_the_rule_is_checked_on_what_it_names():
    """The checker itself: upward and sideways imports are found, downward ones are not."""
    assert forbidden("cni.exe", "pycnid.config")
    assert forbidden("store.etcd", "ipam.records")
    assert forbidden("kernel.nft", "store.base")  # siblings
    assert forbidden("ipam.alloc.planner", "ipam.leases.service")
    assert forbidden("services.proxy.view", "services.ops.edit")
    assert forbidden("plugins.base", "plugins.bridge.plugin")
    assert forbidden("plugins.ipam.plugin", "plugins.svc.plugin")  # siblings
    assert forbidden("plugins.bridge.add", "plugins.ipam.config") is None
    assert forbidden("services.proxy.view", "services.record") is None
    assert forbidden("cli.ipam", "ipam.ops.pools") is None
    assert forbidden("pycnid.wiring", "nodes.context") is None
    assert forbidden("store.etcd_lease", "common.loop") is None
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
