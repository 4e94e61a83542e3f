"""`pycni ns`: label, ls, show — namespaces' labels, which NetworkPolicy namespaceSelectors
match. Behaviour lives in ``netpol.ops.namespaces``."""

from __future__ import annotations

import click

from cli.command import Env, command_options
from cli.output import render_table


@click.group(name="ns")
def command() -> None:
    """Namespaces: their labels (kubernetes.io/metadata.name is always the name)."""


@command.command(name="label")
@click.argument("namespace")
@click.argument("changes", nargs=-1, required=True, metavar="KEY=VALUE... KEY-...")
@click.option("--overwrite", is_flag=True, help="change labels that have another value")
@command_options
def ns_label(env: Env, namespace: str, changes: tuple[str, ...], overwrite: bool) -> None:
    """Set (KEY=VALUE) or remove (KEY-) labels of NAMESPACE, as kubectl label does."""
    from netpol.ops.namespaces import label

    env.emit(label(env.store(), namespace, changes, overwrite), render_labelled)


@command.command(name="ls")
@command_options
def ns_ls(env: Env) -> None:
    """Namespaces with labels, Pods or NetworkPolicies."""
    from netpol.ops.namespaces import list_namespaces

    env.emit(list_namespaces(env.store()), render_list)


@command.command(name="show")
@click.argument("namespace")
@command_options
def ns_show(env: Env, namespace: str) -> None:
    from netpol.ops.namespaces import show_namespace

    env.emit(show_namespace(env.store(), namespace), render_namespace)


def labels_text(labels: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def render_labelled(doc: dict) -> str:
    lines = [f"namespace/{doc['namespace']} labeled: {labels_text(doc['labels'])}"]
    return "\n".join(lines + [f"label {k!r} not found" for k in doc["notFound"]])


def render_list(doc: dict) -> str:
    rows = [
        [n["namespace"], labels_text(n["labels"]), n["pods"], n["policies"]]
        for n in doc["namespaces"]
    ]
    table = render_table(("NAMESPACE", "LABELS", "PODS", "POLICIES"), rows) if rows else ""
    bad = [f"unreadable record {key} (skipped)" for key in doc["unreadable"]]
    return "\n".join([table or "no namespaces", *bad])


def render_namespace(doc: dict) -> str:
    return "\n".join(
        [
            f"namespace {doc['namespace']}",
            f"  labels: {labels_text(doc['labels'])}",
            f"  pods: {', '.join(doc['pods']) or '-'}",
            f"  policies: {', '.join(doc['policies']) or '-'}",
        ]
    )
