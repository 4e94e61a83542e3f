"""The documents of a manifest file as kubectl reads them (pure, no I/O).

A file holds JSON (one object) or YAML (one or many documents separated by ``---``; empty ones
are skipped); a document of kind ``List`` (``v1``) or ``NetworkPolicyList``
(``networking.k8s.io/v1``) stands for its ``items``. What reaches ``parse_policy`` is JSON-shaped,
as the API server receives it: a YAML key that is not a string, or a value JSON cannot hold
(``!!binary``, ``!!set``), is an error naming where it is; YAML timestamps stay the strings they
were written as. Every error names the file, the document (1-based) and the item.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from cni.spec.errors import InvalidConfig

LIST_KINDS = {"List": "v1", "NetworkPolicyList": "networking.k8s.io/v1"}
SCALARS = (str, int, float, bool, type(None))
MAX_VALUES = 100_000  # a NetworkPolicy of 100k values is far past any real one


@dataclass(frozen=True)
class Document:
    where: str  # "FILE: document 2, items[0]"
    manifest: Any


def load_documents(text: str, source: str) -> list[Document]:
    """Every object of the file, Lists flattened into their items."""
    raw = json_or_none(text) if text.lstrip()[:1] in ("{", "[") else None
    loaded = [raw] if raw is not None else load_yaml(text, source)
    found = []
    for number, doc in enumerate(loaded, 1):
        if doc is None:
            continue
        where = f"{source}: document {number}"
        found += flatten(Document(where, check_json(doc, where, "")))
    if not found:
        raise InvalidConfig(f"{source}: no object in the file (a NetworkPolicy is expected)")
    return found


def json_or_none(text: str) -> Any:
    """The JSON object of ``text``, or None when it is no JSON (YAML is tried then)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def load_yaml(text: str, source: str) -> list[Any]:
    import yaml

    try:
        return list(yaml.load_all(text, Loader=json_shaped_loader()))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InvalidConfig(f"{source}: not YAML or JSON{at}: {exc.problem}") from None
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        raise InvalidConfig(f"{source}: not YAML or JSON: {type(exc).__name__}") from None


@functools.cache
def json_shaped_loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader with timestamps left as strings (kubectl's YAML-to-JSON does that);
        built on first use so importing this module does not import yaml."""

    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return Loader


def check_json(value: Any, where: str, path: str) -> Any:
    """``value`` when JSON can hold it: string keys, JSON scalars, lists and objects, at most
    ``MAX_VALUES`` of them (YAML aliases can repeat one node without end, or refer to itself)."""
    seen = 0
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, at = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise InvalidConfig(f"{where}: more than {MAX_VALUES} values (YAML aliases?)")
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise InvalidConfig(
                        f"{where}: {at or '<object>'}: key {key!r} is not a string"
                    )
                stack.append((child, f"{at}.{key}" if at else key))
        elif isinstance(item, list):
            stack += [(child, f"{at}[{i}]") for i, child in enumerate(item)]
        elif not isinstance(item, SCALARS):
            raise InvalidConfig(
                f"{where}: {at or '<object>'}: a {type(item).__name__} is no JSON value"
            )
    return value


def flatten(doc: Document) -> list[Document]:
    manifest = doc.manifest
    if not isinstance(manifest, dict) or manifest.get("kind") not in LIST_KINDS:
        return [doc]
    kind = manifest["kind"]
    if manifest.get("apiVersion") != LIST_KINDS[kind]:
        raise InvalidConfig(f"{doc.where}: apiVersion of a {kind} is {LIST_KINDS[kind]}")
    items = manifest.get("items")
    if not isinstance(items, list):
        raise InvalidConfig(f"{doc.where}: items: a {kind} holds a list of items")
    return [Document(f"{doc.where}, items[{i}]", item) for i, item in enumerate(items)]
