"""`pycni node`: ls, show, rm — parsing and printing only.

Behaviour lives in ``nodes.ops`` (over ``nodes``: records, heartbeats, the reaper's
release); reachability of host-gw peers in ``overlay.underlay.check_direct``, asked in the
network namespace the command runs in. Store options, ``--output`` and the error exit are
those of `pycni ipam` (``cli.command``).
"""

from __future__ import annotations

import time

import click

from cli.command import Env, command_options
from cli.output import cell_text, render_table, when


@click.group(name="node")
def command() -> None:
    """List, inspect and remove cluster nodes (the node registry pycnid keeps in the store)."""


@command.command(name="ls")
@command_options
def node_ls(env: Env) -> None:
    """One row per node: underlay, backend, VTEP, MTU, blocks, health."""
    from nodes.ops import list_nodes

    env.emit({"nodes": list_nodes(env.store(), time.time())}, render_list)


@command.command(name="show")
@click.argument("name")
@command_options
def node_show(env: Env, name: str) -> None:
    """Everything about node NAME: its record, blocks, borrowed addresses, health and (for
    host-gw) whether this host reaches its underlay address directly."""
    from nodes.ops import show_node

    env.emit({"node": show_node(env.store(), name, time.time(), reach_from_here)}, render_show)


@command.command(name="rm")
@click.argument("name")
@click.option(
    "--force",
    is_flag=True,
    help="even while its heartbeat lives (the heartbeat key is deleted too)",
)
@click.option("--dry-run", is_flag=True, help="only list what would be released")
@command_options
def node_rm(env: Env, name: str, force: bool, dry_run: bool) -> int:
    """Take node NAME out: release its Pods' addresses and empty blocks, as the reaper would,
    then delete its node record (peers drop their routes to it). Refused while its heartbeat
    lives, unless --force."""
    from nodes.ops import remove_node

    doc = remove_node(env.store(), name, force=force, dry_run=dry_run)
    env.emit(doc, render_rm)
    return 0 if doc["complete"] else 1


def reach_from_here(address: str) -> str | None:
    """check_direct in the netns this command runs in (pyroute2 imported only for show)."""
    from pyroute2 import IPRoute

    from overlay.underlay import check_direct

    ipr = IPRoute()
    try:
        return check_direct(ipr, address)
    finally:
        ipr.close()


def overlay_cells(row: dict) -> list:
    overlay = row["overlay"] or {}
    vtep = " ".join(filter(None, [overlay.get("vtepMAC"), ",".join(overlay.get("vteps", []))]))
    return [overlay.get("underlay"), overlay.get("backend"), vtep or None, overlay.get("mtu")]


def render_list(doc: dict) -> str:
    if not doc["nodes"]:
        return "no nodes"
    return render_table(
        ("NAME", "UNDERLAY", "BACKEND", "VTEP", "MTU", "BLOCKS", "HEALTH"),
        [
            [
                row["name"],
                *overlay_cells(row),
                row["blockCount"],
                row.get("error") or row["health"]["text"],
            ]
            for row in doc["nodes"]
        ],
    )


def render_show(doc: dict) -> str:
    node = doc["node"]
    overlay = node["overlay"] or {}
    lines = [
        f"node {node['name']}" + ("" if node["record"] else " (no node record)"),
        f"  address: {cell_text(node['address'] or None)}",
        f"  started: {when(node['startedAt'])}",
        f"  health: {node['health']['text']}",
    ]
    lines += [f"  error: {node['error']}"] if node.get("error") else []
    lines += (
        [
            f"  {key}: {cell_text(overlay.get(key))}"
            for key in ("backend", "underlay", "vtepMAC", "vteps", "vni", "port", "mtu")
        ]
        if overlay
        else ["  overlay: -"]
    )
    if node["reachability"] is not None:
        lines.append(f"  reachability: {node['reachability']}")
    lines.append(f"  blocks ({len(node['blocks'])}):")
    lines += [f"    {b['pool']}/{b['cidr']}" for b in node["blocks"]]
    lines.append(f"  borrowed addresses ({len(node['borrowed'])}):")
    lines += [
        f"    {b['address']} in {b['pool']}/{b['block']} (block of {b['owner']})"
        for b in node["borrowed"]
    ]
    return "\n".join(lines)


def render_rm(doc: dict) -> str:
    head = f"node {doc['node']}: " + ("dry run: " if doc["dryRun"] else "")
    lines = [head + doc["summary"]]
    release = doc["release"]
    lines += [f"  released {e['handle']}: {', '.join(e['ips'])}" for e in release["released"]]
    lines += [f"  block returned: {b}" for b in release["blocksReturned"]]
    lines += [
        f"  block kept: {b['block']} ({b['held']} held, {b.get('cooling', 0)} cooling)"
        for b in release["blocksKept"]
    ]
    lines += [f"  error: {e}" for e in release["errors"]]
    if doc["heartbeatDeleted"]:
        lines.append("  heartbeat deleted (--force)")
    if doc["forgotten"]:
        lines.append("  node record deleted: peers drop their routes to it")
    return "\n".join(lines)
