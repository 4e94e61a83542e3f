"""Kubernetes label selectors: ``matchLabels`` and ``matchExpressions`` with every operator.

A selector matches labels when every ``matchLabels`` pair is present and every requirement
holds: ``In`` (the key present with one of the values), ``NotIn`` (the key absent, or its value
none of them), ``Exists``, ``DoesNotExist``. The empty selector (``{}``) matches everything.
Parsing validates as the API server does (metav1 LabelSelector): an unknown operator, values
given to Exists/DoesNotExist or missing from In/NotIn, a bad label key or value are errors
naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cni.spec.errors import InvalidConfig
from services.validate import LABEL_KEY, LABEL_VALUE

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def holds(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        return not present

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.operator in ("In", "NotIn"):
            doc["values"] = list(self.values)
        return doc


@dataclass(frozen=True)
class LabelSelector:
    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.expressions

    @property
    def keys(self) -> frozenset[str]:
        """The label keys ``matches`` reads: labels under other keys never change its
        answer."""
        return frozenset((*(k for k, _v in self.match_labels), *(r.key for r in self.expressions)))

    def matches(self, labels: Mapping[str, str]) -> bool:
        # loops, not all() over generators: a relabel pass matches each selector of its
        # namespace against every Pod there, and the generators were half of that
        for key, value in self.match_labels:
            if labels.get(key) != value:
                return False
        for requirement in self.expressions:
            if not requirement.holds(labels):
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        if self.match_labels:
            doc["matchLabels"] = dict(self.match_labels)
        if self.expressions:
            doc["matchExpressions"] = [r.to_dict() for r in self.expressions]
        return doc


EVERYTHING = LabelSelector()


def invalid(path: str, why: str) -> InvalidConfig:
    return InvalidConfig(f"invalid NetworkPolicy field {path}: {why}")


def validate_known(data: dict[str, Any], path: str, known: tuple[str, ...]) -> None:
    """The API server refuses a field it does not know (strict decoding): so does pycni."""
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise invalid(f"{path}.{unknown[0]}", "unknown field")


def validate_object(data: Any, path: str, known: tuple[str, ...]) -> dict[str, Any]:
    """``data`` as an object of the ``known`` fields only."""
    if not isinstance(data, dict):
        raise invalid(path, f"not an object ({', '.join(known)})")
    validate_known(data, path, known)
    return data


def parse_selector(data: Any, path: str) -> LabelSelector:
    if data is None:
        return EVERYTHING
    data = validate_object(data, path, ("matchLabels", "matchExpressions"))
    labels = data.get("matchLabels")
    labels = {} if labels is None else labels
    if not isinstance(labels, dict):
        raise invalid(f"{path}.matchLabels", "not an object of label: value")
    pairs = []
    for key, value in labels.items():
        validate_key(key, f"{path}.matchLabels")
        validate_value(value, f"{path}.matchLabels.{key}")
        pairs.append((key, value))
    pairs.sort()
    expressions = data.get("matchExpressions")
    expressions = [] if expressions is None else expressions
    if not isinstance(expressions, list):
        raise invalid(f"{path}.matchExpressions", "not a list")
    requirements = tuple(
        parse_requirement(e, f"{path}.matchExpressions[{i}]") for i, e in enumerate(expressions)
    )
    return LabelSelector(tuple(pairs), requirements)


def parse_requirement(data: Any, path: str) -> Requirement:
    data = validate_object(data, path, ("key", "operator", "values"))
    key, operator, values = data.get("key"), data.get("operator"), data.get("values")
    validate_key(key, f"{path}.key")
    if operator not in OPERATORS:
        raise invalid(f"{path}.operator", f"{operator!r} is not one of {', '.join(OPERATORS)}")
    if values is not None and not isinstance(values, list):
        raise invalid(f"{path}.values", "not a list")
    values = values or []
    if operator in ("In", "NotIn") and not values:
        raise invalid(f"{path}.values", f"must be non-empty when operator is {operator}")
    if operator in ("Exists", "DoesNotExist") and values:
        raise invalid(f"{path}.values", f"must be empty when operator is {operator}")
    for index, value in enumerate(values):
        validate_value(value, f"{path}.values[{index}]")
    return Requirement(str(key), str(operator), tuple(sorted(set(values))))


def validate_key(key: Any, path: str) -> None:
    """A qualified name: an optional DNS-subdomain prefix and '/', then a name."""
    prefix, _, _name = key.rpartition("/") if isinstance(key, str) else ("", "", "")
    if (
        not isinstance(key, str)
        or not LABEL_KEY.fullmatch(key)
        or (prefix and not SUBDOMAIN.fullmatch(prefix))
    ):
        raise invalid(path, f"{key!r} is not a label key")


def validate_value(value: Any, path: str) -> None:
    if not isinstance(value, str) or not LABEL_VALUE.fullmatch(value):
        raise invalid(path, f"{value!r} is not a label value")
