"""`pycni netpol`: apply, rm, ls, show, trace, explain — parsing and printing.

Behaviour lives in ``netpol.ops`` (over ``netpol``). ``apply -f FILE|-`` reads the file here
(the one place the CLI touches it) and hands its text on. Store options, ``--output`` and the
error exit are those of `pycni svc` (``cli.command``); ``show`` also prints YAML.
"""

from __future__ import annotations

import sys

import click

from cli.command import Env, Failed, command_options
from cli.output import render_table
from cli.svc import parse_pod, parse_ref


def read_text(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise Failed(f"-f {path}: {exc}") from None


@click.group(name="netpol")
def command() -> None:
    """NetworkPolicies (networking.k8s.io/v1) in the store, and why a connection is allowed."""


@command.command(name="apply")
@click.option("-f", "--filename", "path", required=True, metavar="FILE|-", help="YAML or JSON")
@click.option(
    "-n",
    "--namespace",
    default=None,
    help="for manifests without metadata.namespace [default: default]",
)
@command_options
def netpol_apply(env: Env, path: str, namespace: str | None) -> None:
    """Create or change the NetworkPolicies of FILE (one or many documents, or a List), all
    validated as the API server validates them before any is written."""
    from netpol.ops.edit import apply

    text = read_text(path)
    env.emit(apply(env.store(), text, "<stdin>" if path == "-" else path, namespace), render_apply)


@command.command(name="rm")
@click.argument("ref", metavar="NS/NAME")
@command_options
def netpol_rm(env: Env, ref: str) -> None:
    """Remove a NetworkPolicy."""
    from netpol.ops.edit import remove

    env.emit(remove(env.store(), *parse_ref(ref)), lambda doc: f"removed {doc['removed']}")


@command.command(name="ls")
@click.option("-n", "--namespace", default=None, help="only this namespace's policies")
@command_options
def netpol_ls(env: Env, namespace: str | None) -> None:
    from netpol.ops.edit import list_policies

    env.emit(list_policies(env.store(), namespace), render_list)


@command.command(name="show")
@click.argument("ref", metavar="NS/NAME")
@command_options(outputs=("table", "json", "yaml"))
def netpol_show(env: Env, ref: str) -> None:
    """The policy as stored (json, yaml: the manifest; table: its rules in words)."""
    from netpol.ops.edit import describe, show

    namespace, name = parse_ref(ref)
    if env.output == "table":
        env.emit(describe(env.store(), namespace, name), render_policy)
    else:
        env.emit(show(env.store(), namespace, name), render_policy)


@command.command(name="trace")
@click.option("--from", "source", required=True, metavar="IP[:PORT]", help="the client")
@click.option(
    "--to", "target", required=True, metavar="IP:PORT/PROTO", help="the server (after DNAT)"
)
@command_options
def netpol_trace(env: Env, source: str, target: str) -> None:
    """Whether the store's NetworkPolicies allow the connection, and which policy and rule
    allow it or which policies isolate the Pod without allowing it, per direction."""
    from netpol.ops.trace import trace

    doc = trace(env.store(), source, target)
    env.emit(doc, render_trace)


@command.command(name="explain")
@click.argument("ref", metavar="NS/POD")
@command_options
def netpol_explain(env: Env, ref: str) -> None:
    """The policies isolating a Pod, per direction, and their rules."""
    from netpol.ops.trace import explain

    env.emit(explain(env.store(), *parse_pod(ref)), render_explain)


def unreadable_lines(doc: dict) -> list[str]:
    return [f"unreadable record {key} (skipped)" for key in doc.get("unreadable", ())]


def render_apply(doc: dict) -> str:
    return "\n".join(
        f"networkpolicy.networking.k8s.io/{a['policy']} {a['result']}" for a in doc["applied"]
    )


def render_list(doc: dict) -> str:
    if not doc["policies"]:
        return "\n".join(["no NetworkPolicies", *unreadable_lines(doc)])
    table = render_table(
        ("NAMESPACE", "NAME", "POD-SELECTOR", "POLICY-TYPES"),
        [
            [p["namespace"], p["name"], p["podSelector"], ",".join(p["policyTypes"])]
            for p in doc["policies"]
        ],
    )
    return "\n".join([table, *unreadable_lines(doc)])


def rule_lines(rules: list[dict], indent: str = "    ") -> list[str]:
    if not rules:
        return [f"{indent}(no rules: nothing allowed)"]
    return [f"{indent}rule {r['rule']}: {r['text']}" for r in rules]


def render_policy(doc: dict) -> str:
    lines = [
        f"networkpolicy {doc['policy']}",
        f"  selects: {doc['selects']}",
        f"  policyTypes: {', '.join(doc['policyTypes'])}",
    ]
    for direction in ("ingress", "egress"):
        if direction in doc:
            lines += [f"  {direction}:", *rule_lines(doc[direction])]
    return "\n".join(lines)


def render_trace(doc: dict) -> str:
    verdict = "allowed" if doc["allowed"] else "DENIED"
    lines = [f"{doc['from']} -> {doc['to']}: {verdict}"]
    for direction in ("egress", "ingress"):
        d = doc[direction]
        lines.append(f"  {direction} at {d['pod'] or 'a non-Pod address'}: {d['why']}")
        lines += [
            f"    {a['policy']} {direction} rule {a['rule']}: {a['text']}" for a in d["allowedBy"]
        ]
    lines += [f"  note: {n}" for n in doc["notes"]]
    return "\n".join(lines + unreadable_lines(doc))


def render_explain(doc: dict) -> str:
    labels = ",".join(f"{k}={v}" for k, v in doc["labels"].items()) or "-"
    lines = [f"pod {doc['pod']} ({', '.join(doc['ips']) or 'no address'}; labels {labels})"]
    for direction in ("ingress", "egress"):
        d = doc[direction]
        if not d["isolated"]:
            lines.append(f"  {direction}: not isolated (no policy selects it): everything allowed")
            continue
        lines.append(f"  {direction}: isolated; allowed is what these rules allow:")
        for p in d["policies"]:
            lines += [f"    {p['policy']}", *rule_lines(p["rules"], "      ")]
    return "\n".join(lines + unreadable_lines(doc))
