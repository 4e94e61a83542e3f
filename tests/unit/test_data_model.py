"""One data model: every store key prefix, record codec and shared default is defined once.

A grep over the source (its syntax tree, so docstrings and comments do not count): the key
layout lives in ``store/keys.py`` and the codec in ``store/codec.py``; the operator tools
(``ipam.ops``, ``cli``) and pycnid import them instead of writing their own. And the layers
below the operator tools never import them (usage counting sits in ``ipam.alloc.usage`` for
that).
"""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYERS = (
    "cni",
    "common",
    "kernel",
    "store",
    "ipam",
    "nodes",
    "masq",
    "services",
    "netpol",
    "overlay",
    "plugins",
    "pycnid",
    "cli",
)
SOURCES = sorted(p for top in LAYERS for p in (ROOT / top).rglob("*.py"))
KEYS = ROOT / "store" / "keys.py"
CODEC = ROOT / "store" / "codec.py"
STORE_BASE = ROOT / "store" / "base.py"  # PREFIX itself: the store's namespace
KEY_OWNERS = {KEYS, STORE_BASE}
CODEC_NAMES = {"encode", "decode", "load_json", "decoded"}
LOWER = [
    ROOT / "cni",
    ROOT / "store",
    *(ROOT / "ipam" / d for d in ("alloc", "leases", "outage")),
    ROOT / "nodes",
    ROOT / "services",
    ROOT / "pycnid",
]


def tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def rel(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def docstrings(module: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings."""
    out = set()
    for node in ast.walk(module):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            out.add(id(body[0].value))
    return out


def key_literals(module: ast.Module) -> list[str]:
    """String literals that spell a store key, and PREFIX + "..." / f"{PREFIX}..." keys."""
    skip, found = docstrings(module), []
    for node in ast.walk(module):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip
            and "pycni/v1/" in node.value
        ):
            found.append(node.value)
        elif (
            isinstance(node, ast.JoinedStr)
            and any(
                isinstance(v, ast.FormattedValue)
                and isinstance(v.value, ast.Name)
                and v.value.id == "PREFIX"
                for v in node.values
            )
            and len(node.values) > 1
        ):
            found.append(ast.unparse(node))
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Add)
            and isinstance(node.left, ast.Name)
            and node.left.id == "PREFIX"
        ):
            found.append(ast.unparse(node))
    return found


def test_store_keys_are_spelled_only_in_records():
    found = {
        rel(p): keys
        for p in SOURCES
        if p not in KEY_OWNERS
        for keys in [key_literals(tree(p))]
        if keys
    }
    assert found == {}, "define store keys in store/keys.py and import them"


def test_record_codecs_are_defined_only_in_records():
    found = sorted(
        f"{rel(p)}: {node.name}"
        for p in SOURCES
        if p != CODEC
        and not rel(p).startswith("cni/")  # (cni/spec's netconf codecs are not records)
        for node in ast.walk(tree(p))
        if isinstance(node, ast.FunctionDef) and node.name in CODEC_NAMES
    )
    assert found == [], "use store.codec.encode/decode (and the record types)"


def module_constants(module: ast.Module) -> dict[str, str]:
    """Module-level UPPER_CASE = <literal> assignments: name -> literal source."""
    out = {}
    for node in module.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.isupper()
        ):
            try:
                ast.literal_eval(node.value)
            except ValueError:
                continue
            out[node.targets[0].id] = ast.unparse(node.value)
    return out


def test_default_constants_are_defined_once():
    names, values = defaultdict(list), defaultdict(list)
    for path in SOURCES:
        for name, literal in module_constants(tree(path)).items():
            if name.startswith("DEFAULT_"):
                names[name].append(rel(path))
                values[literal].append(f"{rel(path)}:{name}")
    assert {n: ps for n, ps in names.items() if len(ps) > 1} == {}
    twins = {
        v: where for v, where in values.items() if len(where) > 1 and v.startswith("{")
    }  # e.g. {4: 26, 6: 122} under two names
    assert twins == {}


@pytest.mark.parametrize(
    "name",
    [
        "POOLS",
        "BLOCKS",
        "HANDLES",
        "AFFINITY",
        "NODES",
        "HEARTBEATS",
        "SUSPECTS",
        "POOLS_MARKER",
        "BUFFER_NETWORK",
        "SERVICES",
        "ENDPOINTS",
        "SERVICE_IPS",
        "NODE_PORTS",
        "SERVICES_META",
        "NETPOLS",
        "NAMESPACES",
    ],
)
def test_key_constants_are_assigned_only_in_keys(name):
    owners = [
        rel(p)
        for p in SOURCES
        for node in tree(p).body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id == name
    ]
    assert owners == ["store/keys.py"]


def imported_modules(module: ast.Module) -> set[str]:
    out = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_below_the_operator_tools_nothing_imports_them():
    found = sorted(
        f"{rel(p)} imports {name}"
        for top in LOWER
        for p in top.rglob("*.py")
        for name in imported_modules(tree(p))
        if name.split(".")[:2] in (["ipam", "ops"], ["ipam", "cli"])
    )
    assert found == []


def test_the_grep_sees_a_second_definition():
    """The checks above catch what they are meant to (on a made-up module)."""
    module = ast.parse(
        'POOLS = f"{PREFIX}pools/"\nX = PREFIX + "meta/x"\n'
        'Y = "/pycni/v1/blocks/"\nDEFAULT_BLOCK_SIZE = {4: 26, 6: 122}\n'
        "def encode(d): ...\nimport ipam.ops.inspect\n"
    )
    assert len(key_literals(module)) == 3
    assert "DEFAULT_BLOCK_SIZE" in module_constants(module)
    assert "ipam.ops.inspect" in imported_modules(module)
