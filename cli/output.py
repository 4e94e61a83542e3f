"""How `pycni ipam` prints its reports for people: aligned tables and short lines (pure).

Every function takes the same JSON-ready document ``--output json`` prints, so the two
outputs never disagree.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from typing import Any


def render_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; columns of numbers right-aligned."""
    rows = [list(row) for row in rows]
    right = [
        any(is_number(row[i]) for row in rows)
        and all(is_number(row[i]) or row[i] is None for row in rows)
        for i in range(len(headers))
    ]
    cells = [[cell_text(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    lines = [fit(list(headers), widths, [False] * len(headers))]
    lines += [fit(row, widths, right) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def fit(row: Sequence[str], widths: list[int], right: Sequence[bool]) -> str:
    return "  ".join(
        cell.rjust(w) if r else cell.ljust(w)
        for cell, w, r in zip(row, widths, right, strict=False)
    )


def cell_text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def when(seconds: float | None) -> str:
    if not seconds:
        return "-"
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render_pool(record: dict) -> str:
    keys = (
        "name",
        "cidr",
        "blockSize",
        "disabled",
        "nodeSelector",
        "strictAffinity",
        "exclusions",
        "gateway",
        "reuseDelay",
        "source",
        "network",
    )
    return "\n".join(f"  {k}: {pool_value(k, record[k])}" for k in keys if k in record)


def pool_value(key: str, value: Any) -> str:
    return selector(value) if key == "nodeSelector" else cell_text(value)


def selector(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items())) or "all()"
    return str(value)


def render_pool_list(doc: dict) -> str:
    if not doc["pools"]:
        return "no pools"
    rows = [
        [
            p["name"],
            p.get("cidr"),
            f"/{p['blockSize']}" if p.get("blockSize") else None,
            p.get("source"),
            p.get("disabled"),
            p.get("strictAffinity"),
            p.get("gateway"),
            p.get("reuseDelay"),
            p.get("nodeSelector"),
            p.get("exclusions"),
            p.get("error"),
        ]
        for p in doc["pools"]
    ]
    return render_table(
        [
            "NAME",
            "CIDR",
            "BLOCK",
            "SOURCE",
            "DISABLED",
            "STRICT",
            "GATEWAY",
            "REUSE",
            "SELECTOR",
            "EXCLUSIONS",
            "ERROR",
        ],
        rows,
    )


def render_overview(doc: dict) -> str:
    pools = [
        [
            p["name"],
            p.get("cidr"),
            p.get("source"),
            p.get("size"),
            p.get("reserved"),
            p.get("used"),
            p.get("free"),
            p.get("cooling"),
            p.get("borrowed"),
            p["blocks"],
            p.get("disabled"),
            p.get("error"),
        ]
        for p in doc["pools"]
    ]
    out = [
        f"POOLS (revision {doc['revision']:d})",
        render_table(
            [
                "NAME",
                "CIDR",
                "SOURCE",
                "SIZE",
                "RESERVED",
                "USED",
                "FREE",
                "COOLING",
                "BORROWED",
                "BLOCKS",
                "DISABLED",
                "ERROR",
            ],
            pools,
        )
        if pools
        else "no pools",
    ]
    if doc["blocks"]:
        blocks = [
            [
                b["pool"],
                b["cidr"],
                b["node"] or None,
                b.get("capacity"),
                b["used"],
                b.get("free"),
                b.get("cooling"),
                b.get("borrowed"),
                "orphan" if b.get("orphan") else None,
            ]
            for b in doc["blocks"]
        ]
        out += [
            "",
            "BLOCKS",
            render_table(
                [
                    "POOL",
                    "BLOCK",
                    "NODE",
                    "CAPACITY",
                    "USED",
                    "FREE",
                    "COOLING",
                    "BORROWED",
                    "NOTE",
                ],
                blocks,
            ),
        ]
    if doc["nodes"]:
        nodes = [
            [n["name"], n["alive"], len(n["blocks"]), n["used"], n["handles"], n["addresses"]]
            for n in doc["nodes"]
        ]
        out += [
            "",
            "NODES",
            render_table(
                ["NODE", "ALIVE", "BLOCKS", "USED IN BLOCKS", "HANDLES", "ADDRESSES HELD"], nodes
            ),
        ]
    return "\n".join(out)


def render_ip(doc: dict) -> str:
    if not doc["matches"]:
        lines = [f"{doc['ip']}: in no pool"]
    else:
        lines = [f"{doc['ip']}: {describe_match(m)}" for m in doc["matches"]]
    if doc["listedByHandles"]:
        lines.append(f"  listed by handle(s): {', '.join(doc['listedByHandles'])}")
    return "\n".join(lines)


def describe_match(m: dict) -> str:
    where = f"pool {m['pool']}, block {m['block']}"
    if m["blockNode"]:
        where += f" (node {m['blockNode']})"
    state = m["state"]
    if state == "allocated":
        pod = f"{m.get('namespace')}/{m.get('pod')}" if m.get("pod") else None
        who = ", ".join(
            x
            for x in (
                f"handle {m['handle']}",
                pod and f"pod {pod}",
                m.get("node") and f"node {m['node']}",
            )
            if x
        )
        extra = "" if m["handleExists"] else " (handle missing: run pycni ipam check)"
        return f"allocated to {who}{' (borrowed)' if m['borrowed'] else ''}; {where}{extra}"
    if state == "reserved":
        return f"never handed out: {m['reason']}; {where}"
    if state == "cooling":
        return f"free, cooling until {when(m['coolingUntil'])}; {where}"
    return f"free; {where}" + ("" if m["blockClaimed"] else ", block not claimed")


def render_handles(doc: dict) -> str:
    out = []
    for h in doc["handles"]:
        attrs = ", ".join(f"{k}={v}" for k, v in sorted(h["attributes"].items()))
        out += [
            f"handle {h['handle']}",
            f"  node: {h['node'] or '-'}",
            f"  created: {when(h['createdAt'])}",
            f"  attributes: {attrs or '-'}",
        ]
        rows = [
            [i["address"], i["gateway"], i["pool"], i["block"], i["blockNode"], i["inBlock"]]
            for i in h["ips"]
        ]
        out += [
            "  " + line
            for line in render_table(
                ["ADDRESS", "GATEWAY", "POOL", "BLOCK", "BLOCK NODE", "IN BLOCK"], rows
            ).split("\n")
        ]
    return "\n".join(out)


def render_check(doc: dict) -> str:
    counts = doc["counts"]
    scope = (
        f"{counts['pools']} pools, {counts['blocks']} blocks, {counts['handles']} "
        f"handles, {counts['allocations']} allocations at revision {doc['revision']}"
    )
    if not doc["problems"]:
        return f"OK: no problems in {scope}"
    rows = [
        [p["kind"], p["message"], ",".join(f["action"] for f in p["fixes"]) or "(by hand)"]
        for p in doc["problems"]
    ]
    return f"{len(doc['problems'])} problem(s) in {scope}:\n" + render_table(
        ["KIND", "PROBLEM", "GC FIX"], rows
    )


def render_gc(doc: dict) -> str:
    prefix = "dry run: " if doc["dryRun"] else ""
    count = len(doc["fixes"])
    lines = [
        f"{prefix}{count} fix(es) {'planned' if doc['dryRun'] else 'tried'}"
        if count
        else f"{prefix}nothing to fix"
    ]
    for f in doc["fixes"]:
        status = f["status"] + (f" ({f['detail']})" if f.get("detail") else "")
        lines.append(
            f"  {status}: {f['action']} {f.get('ip') or f.get('handle') or ''} - {f['problem']}"
        )
    for p in doc["remaining"]:
        lines.append(f"  left for an operator: {p['kind']}: {p['message']}")
    lines.append(f"dead-node reaper: {doc['reaper']['summary']}")
    return "\n".join(lines)
