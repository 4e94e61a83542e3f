"""`pycni ipam`: pools, show, check, gc, release — parsing and printing only.

Behaviour lives in ``ipam.ops.pools`` (pool CRUD), ``ipam.inspect*`` (reports),
``ipam.ops.repair`` / ``ipam.ops.release`` (gc and release writes) and ``nodes.reaper`` (dead
nodes). Every command takes
the store options and ``--output table|json``; errors are one message on stderr and exit
status 1; ``check`` (and ``gc`` when problems remain that it cannot fix) exit with status 2.
"""

from __future__ import annotations

import ipaddress
import time
from typing import TYPE_CHECKING

import click

from cli.command import EXIT_PROBLEMS, Env, Failed, command_options
from cli.output import (
    render_check,
    render_gc,
    render_handles,
    render_ip,
    render_overview,
    render_pool,
    render_pool_list,
)
from ipam.alloc.pool_spec import DEFAULT_REUSE_DELAY

if TYPE_CHECKING:
    from ipam.ops.inspect import Snapshot


@click.group(name="ipam")
def command() -> None:
    """Inspect and manage cluster IPAM: pools, blocks, handles (the store pycnid uses)."""


@command.group(name="pool")
def pool() -> None:
    """Create, change, remove and list address pools."""


@pool.command(name="add")
@click.argument("name")
@click.option("--cidr", required=True, help="the pool's network, e.g. 10.244.0.0/16")
@click.option(
    "--block-size",
    type=int,
    default=None,
    help="prefix length of node blocks (v4 20-32, default 26; v6 116-128, default 122)",
)
@click.option(
    "--node-selector",
    multiple=True,
    metavar="LABEL=VALUE",
    help="only nodes with these labels (repeatable; default all nodes)",
)
@click.option("--disabled", is_flag=True, help="create it disabled (no new allocations)")
@click.option("--strict-affinity", is_flag=True, help="never borrow from other nodes' blocks")
@click.option(
    "--exclude", multiple=True, metavar="CIDR|A-B", help="addresses never handed out (repeatable)"
)
@click.option(
    "--gateway",
    type=click.Choice(["none", "first"]),
    default="first",
    show_default=True,
    help="first: each block's first usable address is its gateway "
    "(what a bridge with isGateway needs); none: no gateway is handed out",
)
@click.option(
    "--reuse-delay",
    type=float,
    default=DEFAULT_REUSE_DELAY,
    show_default=True,
    help="seconds a released address waits before it is handed out again",
)
@command_options
def pool_add(
    env: Env,
    name: str,
    cidr: str,
    block_size: int | None,
    node_selector: tuple[str, ...],
    disabled: bool,
    strict_affinity: bool,
    exclude: tuple[str, ...],
    gateway: str,
    reuse_delay: float,
) -> None:
    """Create the pool NAME."""
    from ipam.alloc.pool_settings import parse_node_selector
    from ipam.alloc.pool_spec import make_pool
    from ipam.ops.pools import add_pool

    spec = make_pool(
        name,
        cidr,
        block_size=block_size,
        node_selector=parse_node_selector(node_selector),
        disabled=disabled,
        strict_affinity=strict_affinity,
        exclusions=exclude,
        gateway=gateway,
        reuse_delay=reuse_delay,
        created_at=round(time.time(), 3),
    )
    record = add_pool(env.store(), spec)
    env.emit({"pool": record}, lambda d: f"pool {name} added\n{render_pool(d['pool'])}")


@pool.command(name="set")
@click.argument("name")
@click.option("--cidr", default=None, help="immutable: only its current value is accepted")
@click.option("--block-size", type=int, default=None, help="immutable, like --cidr")
@click.option(
    "--disabled/--enabled",
    "disabled",
    default=None,
    help="stop (or resume) new allocations from the pool",
)
@click.option(
    "--strict-affinity/--no-strict-affinity",
    "strict",
    default=None,
    help="never (or again) borrow from other nodes' blocks",
)
@click.option(
    "--node-selector",
    multiple=True,
    metavar="LABEL=VALUE",
    help="replace the node selector (repeatable)",
)
@click.option("--all-nodes", is_flag=True, help="clear the node selector")
@click.option("--exclude", multiple=True, metavar="CIDR|A-B", help="add an exclusion")
@click.option("--remove-exclusion", multiple=True, metavar="CIDR|A-B", help="remove an exclusion")
@click.option("--clear-exclusions", is_flag=True, help="remove every exclusion")
@click.option(
    "--gateway",
    type=click.Choice(["none", "first"]),
    default=None,
    help="first: each block's first usable address is its gateway",
)
@click.option(
    "--reuse-delay",
    type=float,
    default=None,
    help="seconds a released address waits before it is handed out again",
)
@command_options
def pool_set(
    env: Env,
    name: str,
    cidr: str | None,
    block_size: int | None,
    disabled: bool | None,
    strict: bool | None,
    node_selector: tuple[str, ...],
    all_nodes: bool,
    exclude: tuple[str, ...],
    remove_exclusion: tuple[str, ...],
    clear_exclusions: bool,
    gateway: str | None,
    reuse_delay: float | None,
) -> None:
    """Change the mutable settings of the pool NAME."""
    from ipam.alloc.pool_settings import parse_node_selector
    from ipam.ops.pool_update import PoolUpdate
    from ipam.ops.pools import set_pool

    if node_selector and all_nodes:
        raise Failed("--node-selector and --all-nodes contradict each other")
    selector = {} if all_nodes else parse_node_selector(node_selector) if node_selector else None
    update = PoolUpdate(
        cidr=cidr,
        block_size=block_size,
        disabled=disabled,
        strict_affinity=strict,
        node_selector=selector,
        add_exclusions=exclude,
        remove_exclusions=remove_exclusion,
        clear_exclusions=clear_exclusions,
        gateway=gateway,
        reuse_delay=reuse_delay,
    )
    if update == PoolUpdate():
        raise Failed(f"nothing to change for pool {name}", "see pycni ipam pool set --help")
    result = set_pool(env.store(), name, update)
    changed = sorted(
        k for k in {*result.old, *result.new} if result.old.get(k) != result.new.get(k)
    )
    env.emit(
        {
            "pool": result.new,
            "previous": result.old,
            "changed": changed,
            "warnings": result.warnings,
        },
        render_set,
    )


def render_set(doc: dict) -> str:
    name = doc["pool"]["name"]
    head = (
        f"pool {name}: changed {', '.join(doc['changed'])}"
        if doc["changed"]
        else f"pool {name}: unchanged"
    )
    return "\n".join([head, render_pool(doc["pool"]), *(f"warning: {w}" for w in doc["warnings"])])


@pool.command(name="rm")
@click.argument("name")
@click.option(
    "--force", is_flag=True, help="also release every address of the pool still held by a pod"
)
@command_options
def pool_rm(env: Env, name: str, force: bool) -> None:
    """Remove the pool NAME (refused while pods hold its addresses, unless --force)."""
    from ipam.ops.pools import remove_pool

    doc = remove_pool(env.store(), name, force=force)
    env.emit(
        doc,
        lambda d: (
            f"pool {name} removed ({d['releasedAddresses']} address(es) "
            f"released, {d['deletedBlocks']} block(s) deleted)"
        ),
    )


@pool.command(name="ls")
@command_options
def pool_ls(env: Env) -> None:
    """List the pools and their settings."""
    from ipam.alloc.pool_spec import render_selector
    from ipam.ops.pools import list_pools

    rows = []
    for view in list_pools(env.store()):
        row = {**view.record, "name": view.name}
        if view.spec is not None:
            row.update(
                source=view.spec.source,
                blockSize=view.spec.block_size,
                nodeSelector=render_selector(view.spec.node_selector),
                strictAffinity=view.spec.strict_affinity,
                gateway=view.spec.gateway,
                reuseDelay=view.spec.reuse_delay,
                exclusions=list(view.spec.exclusions),
            )
        else:
            row["error"] = view.error
        rows.append(row)
    env.emit({"pools": rows}, render_pool_list)


@command.command(name="show")
@click.argument("target", required=False)
@command_options
def show(env: Env, target: str | None) -> None:
    """Pools and blocks (no TARGET), who holds an address (TARGET an IP), or a handle's
    addresses (TARGET network/containerID[/ifname] or a containerID)."""
    from ipam.ops.repair import read_snapshot
    from ipam.ops.show import report_handle, report_ip, report_overview

    snap = read_snapshot(env.store())
    now = time.time()
    if target is None:
        env.emit(report_overview(snap, now), render_overview)
    elif is_address(target):
        env.emit(report_ip(snap, target.split("/")[0], now), render_ip)
    else:
        doc = report_handle(snap, target)
        if not doc["handles"]:
            raise Failed(
                f"no handle matches {target}",
                "give network/containerID/ifname, network/containerID or a "
                "containerID (pycni ipam show lists pools and blocks)",
            )
        env.emit(doc, render_handles)


def is_address(text: str) -> bool:
    try:
        ipaddress.ip_interface(text)
    except ValueError:
        return False
    return True


def check_document(snap: Snapshot) -> dict:
    """`check`'s JSON: the findings of one snapshot and what was looked at."""
    from ipam.ops.check import find_problems

    problems = find_problems(snap)
    return {
        "revision": snap.revision,
        "ok": not problems,
        "counts": {
            "pools": len(snap.pools),
            "blocks": len(snap.blocks),
            "handles": len(snap.handles),
            "allocations": sum(len(b.allocations) for b in snap.blocks.values()),
        },
        "problems": [p.to_dict() for p in problems],
    }


@command.command(name="check")
@command_options
def check(env: Env) -> int:
    """Cross-check pools, blocks and handles cluster-wide; exit 2 when problems exist."""
    from ipam.ops.repair import read_snapshot

    doc = check_document(read_snapshot(env.store()))
    env.emit(doc, render_check)
    return EXIT_PROBLEMS if doc["problems"] else 0


@command.command(name="gc")
@click.option("--dry-run", is_flag=True, help="only list what would be released or repaired")
@click.option(
    "--grace",
    type=float,
    default=None,
    help="seconds a node's heartbeat must be gone before its addresses are "
    "reclaimed (default: the daemon config's ipam.reapGrace, else 900)",
)
@command_options
def gc(env: Env, dry_run: bool, grace: float | None) -> int:
    """Release orphan allocations and handles, repair what check finds, and reclaim the
    addresses of nodes dead for longer than the grace period."""
    from cli.gc import run_gc

    doc = run_gc(env, dry_run, grace)
    env.emit(doc, render_gc)
    return EXIT_PROBLEMS if doc["remaining"] and not dry_run else 0


@command.command(name="release")
@click.argument("ip")
@click.option(
    "--pool",
    "pool_name",
    default=None,
    help="the pool, when netconf pools of several networks share the address",
)
@command_options
def release(env: Env, ip: str, pool_name: str | None) -> None:
    """Free the address IP and remove it from the handle holding it (one transaction)."""
    from ipam.ops.release import release_ip

    doc = release_ip(env.store(), ip, pool=pool_name)
    env.emit(doc, render_release)


def render_release(doc: dict) -> str:
    if not doc["released"]:
        return f"{doc['ip']}: nothing released ({doc['reason']})"
    deleted = (
        f"; handle(s) deleted: {', '.join(doc['deletedHandles'])}" if doc["deletedHandles"] else ""
    )
    return (
        f"{doc['ip']}: released from pool {doc['pool']} "
        f"(handle(s) {', '.join(doc['handles']) or '-'}){deleted}"
    )


@command.command(name="release-node")
@click.argument("node")
@click.option("--force", is_flag=True, help="even if the node's heartbeat is present")
@click.option("--dry-run", is_flag=True, help="only list what would be released")
@command_options
def release_node(env: Env, node: str, force: bool, dry_run: bool) -> int:
    """Release every address held by NODE's pods and return its empty blocks."""
    from nodes import reaper

    report = reaper.release_node(env.store(), node, force=force, dry_run=dry_run)
    doc = {**report.to_dict(), "dryRun": dry_run, "summary": report.summary()}
    env.emit(doc, lambda d: f"node {node}: {'dry run: ' if dry_run else ''}{d['summary']}")
    return 0 if report.complete else 1
