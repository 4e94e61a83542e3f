"""The layout the README's ``## Architecture`` section writes down stays true.

The section's tree lists every package under ``cni/`` and ``ipam/`` (and nothing that is
gone), and every import in ``cni/`` and ``ipam/`` (lazy ones inside functions too, parsed
with ``ast``, nothing imported) keeps the dependency rule: operator tools and the daemon on
top, the store at the bottom, one way.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]
TOP = ("ipam.ops", "ipam.cli", "ipam.daemon")  # on top: nothing below imports them
BELOW = ("ipam.records", "ipam.loop", "ipam.metrics", "ipam.store", "ipam.alloc", "ipam.leases",
         "ipam.outage", "ipam.nodes", "ipam.services")
ENTRY = re.compile(r"^( *)(\S+(?:/|\.py))(?:\s|$)")  # a tree line: indent, folder/ or file.py
# Imports against the rule that are known and not yet moved: (importer, imported) -> what is
# to change. The test fails when one is gone, so the entry goes with the fix; never add one.
PENDING = {
}


def architecture_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Architecture\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def tree_block() -> list[str]:
    """The code block of the section that holds the tree (it starts with ``cni/``)."""
    blocks = architecture_section().split("```")[1::2]
    return next(b for b in blocks if b.lstrip("\n").startswith("cni/")).splitlines()


def listed_paths() -> set[str]:
    """Every folder (``name/``) and module (``name.py``) of the tree, as a path from the root."""
    stack: list[str] = []
    paths = set()
    for line in tree_block():
        match = ENTRY.match(line)
        if match is None or len(match.group(1)) % 2:
            continue
        depth = len(match.group(1)) // 2
        if depth > len(stack):  # a continuation line, not an entry
            continue
        stack[depth:] = [match.group(2).rstrip("/")]
        paths.add("/".join(stack))
    return paths


def packages() -> set[str]:
    return {str(init.parent.relative_to(ROOT)) for top in ("cni", "ipam")
            for init in (ROOT / top).rglob("__init__.py")}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, relative imports resolved."""
    package = module_name(path) if path.name == "__init__.py" else \
        module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                yield f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def forbidden(importer: str, target: str) -> str | None:
    """Why ``importer`` may not import ``target``; None when it may."""
    if within(importer, ("cni",)) and within(target, TOP):
        return "cni/ never imports the operator tools or the daemon"
    if within(importer, BELOW) and within(target, TOP):
        return "nothing below ops/, cli/ and daemon/ imports them"
    if within(importer, ("ipam.ops", "ipam.daemon")) and within(target, ("ipam.cli",)):
        return "cli/ is the top: only it imports itself"
    if within(importer, ("ipam.ops",)) and within(target, ("ipam.daemon",)) or \
            within(importer, ("ipam.daemon",)) and within(target, ("ipam.ops",)):
        return "the operator tools and the daemon stand side by side"
    if within(importer, ("ipam.store",)) and within(target, ("ipam",)) and \
            not within(target, ("ipam.store", "ipam.loop")):
        return "store/ is the bottom: of ipam/ it imports only the loop helper"
    if within(importer, ("ipam.records",)) and within(target, ("ipam",)) and \
            not within(target, ("ipam.store", "ipam.records")):
        return "the data model imports only store/"
    if within(importer, ("ipam.loop", "ipam.metrics")) and within(target, ("ipam",)):
        return "the loop helper and the metrics registry are leaves"
    return None


def import_graph() -> dict[str, set[str]]:
    """Module -> the cni/ipam modules it imports."""
    return {module_name(path): {t for t in imported(path) if within(t, ("cni", "ipam"))}
            for top in ("cni", "ipam") for path in sorted((ROOT / top).rglob("*.py"))}


def violations() -> dict[tuple[str, str], str]:
    return {(importer, target): why for importer, targets in import_graph().items()
            for target in targets if (why := forbidden(importer, target))}


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def package_cycles() -> set[tuple[str, str]]:
    """Pairs of ipam/ packages that import each other, sorted (a pending import not counted)."""
    edges = {(package_of(m), package_of(t)) for m, ts in import_graph().items() for t in ts
             if within(m, ("ipam",)) and within(t, ("ipam",)) and (m, t) not in PENDING}
    return {tuple(sorted(e)) for e in edges if e[0] != e[1] and (e[1], e[0]) in edges}


def test_every_package_is_in_the_architecture_tree():
    missing = packages() - listed_paths()
    assert not missing, f"README ## Architecture does not list {sorted(missing)}"


def test_everything_the_tree_lists_exists():
    gone = sorted(p for p in listed_paths() if not (ROOT / p).exists())
    assert not gone, f"README ## Architecture lists what is not there: {gone}"


def test_the_section_states_the_request_path_and_the_rule():
    section = architecture_section()
    for step in ("cni/exe.py", "unix socket", "server", "dispatch", "handler", "netlink",
                 "nftables", "store", "dependency rule"):
        assert step in section, step


def test_imports_keep_the_dependency_rule():
    found = {pair: why for pair, why in violations().items() if pair not in PENDING}
    assert not found, "\n".join(f"{a} imports {b}: {why}" for (a, b), why in sorted(found.items()))


def test_ipam_packages_depend_one_way():
    cycles = package_cycles() - set(PENDING)
    assert not cycles, f"ipam/ packages that import each other: {sorted(cycles)}"


def test_pending_exceptions_are_still_needed():
    """A fixed exception leaves the list with its fix."""
    still = set(violations()) | package_cycles()
    assert set(PENDING) <= still, f"fixed, remove from PENDING: {sorted(set(PENDING) - still)}"


def test_the_rule_is_checked_on_what_it_names():
    """The checker itself: the imports the rule forbids are found, allowed ones are not."""
    assert forbidden("cni.plugins.base", "ipam.daemon.metrics")
    assert forbidden("cni.plugins.ipam", "ipam.ops.inspect")
    assert forbidden("ipam.leases.metrics", "ipam.ops.inspect")
    assert forbidden("ipam.store.etcd", "ipam.records")
    assert forbidden("ipam.records", "ipam.alloc.pool_spec")
    assert forbidden("cni.plugins.ipam", "ipam.leases.service") is None
    assert forbidden("ipam.cli.ipam", "ipam.ops.pools") is None
    assert forbidden("ipam.daemon.wiring", "ipam.nodes.services") is None
    assert forbidden("ipam.store.etcd_lease", "ipam.loop") is None


def test_ipam_top_level_stays_small():
    modules = [p.name for p in (ROOT / "ipam").glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= 10, f"ipam/ has {len(modules)} top-level modules: {sorted(modules)}"
