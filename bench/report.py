"""Render the benchmark table: pycni | reference | ratio | goal | PASS/MISS, one line a figure."""

from __future__ import annotations

from dataclasses import dataclass

SCALE = {"ms": 1e3, "s": 1.0, "MiB": 1.0}


@dataclass(frozen=True)
class Row:
    label: str
    ours: float | None  # seconds (ms/s rows) or the value itself (MiB)
    reference: float | None
    goal: float | None  # max ratio ours/reference; None = informational
    unit: str

    @property
    def ratio(self) -> float | None:
        if self.ours is None or not self.reference:
            return None
        return self.ours / self.reference

    @property
    def verdict(self) -> str:
        if self.goal is None:
            return ""
        if self.ratio is None:
            return "n/a"
        return "PASS" if self.ratio <= self.goal else "MISS"

    def as_dict(self) -> dict:
        return {
            "label": self.label.strip(),
            "ours": self.ours,
            "reference": self.reference,
            "ratio": self.ratio,
            "goal": self.goal,
            "verdict": self.verdict,
            "unit": self.unit,
        }


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    return f"{value * SCALE[unit]:.2f} {unit}" if unit != "MiB" else f"{value:.1f} MiB"


def render_row(r: Row, width: int) -> str:
    ratio = f"{r.ratio:.2f}x" if r.ratio is not None else ""
    goal = f"<={r.goal:.1f}x" if r.goal is not None else ""
    return (
        f"{r.label:{width}}{fmt(r.ours, r.unit):>12}{fmt(r.reference, r.unit):>12}"
        f"{ratio:>8}{goal:>8}  {r.verdict}"
    ).rstrip()


def render_table(report: dict, sections: list[tuple[str, list[Row]]]) -> str:
    """`sections`: (title, rows); an empty title continues without a heading line."""
    machine = report["machine"]
    width = max(len(r.label) for _, rows in sections for r in rows) + 2
    lines = [
        f"pycni bench  {report['when']}  {machine['cores']} cores  "
        f"Python {machine['python']}  kernel {machine['kernel']}  load average "
        f"{machine['loadavg_start']} -> {machine['loadavg_end']} (other work on the machine)",
        f"reference: {report['reference']} (Go bridge + host-local), "
        "each side in its own node namespace",
        "",
        f"{'':{width}}{'pycni':>12}{'reference':>12}{'ratio':>8}{'goal':>8}  result",
        "-" * (width + 48),
    ]
    for title, rows in sections:
        if title:
            lines.append(f"[{title}]")
        lines.extend(render_row(r, width) for r in rows)
    return "\n".join(lines)
