"""Prometheus metrics for pycnid: a tiny registry that renders the text format.

Counters, gauges (set or computed at scrape time) and histograms with fixed buckets. Thread-safe;
no third-party client library (the exposition format is a few lines of text). A leaf: the layers
below the daemon count on it; pycnid serves it (``pycnid/metrics_server.py``).
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

log = logging.getLogger("pycnid.metrics")

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
Labels = tuple[tuple[str, str], ...]
M = TypeVar("M", bound="Metric")
GaugeValues = Mapping[Labels, float]  # what a Gauge's ``collect`` returns


def _labels(labels: dict[str, str] | None) -> Labels:
    return tuple(sorted((labels or {}).items()))


def _fmt_labels(labels: Labels, extra: Labels = ()) -> str:
    items = labels + extra
    if not items:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in items)
    return "{" + body + "}"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metric:
    kind = "untyped"

    def __init__(self, name: str, help_text: str) -> None:
        self.name = name
        self.help = help_text
        self._lock = threading.Lock()

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        yield from self._samples()

    def _samples(self) -> Iterable[str]:
        return ()


class Counter(Metric):
    kind = "counter"

    def __init__(self, name: str, help_text: str) -> None:
        super().__init__(name, help_text)
        self._values: dict[Labels, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = _labels(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(_labels(labels), 0.0)

    def _samples(self) -> Iterable[str]:
        with self._lock:
            items = list(self._values.items())
        for key, value in items:
            yield f"{self.name}{_fmt_labels(key)} {value:g}"


class Gauge(Metric):
    """Set explicitly, or computed at scrape time by ``collect`` -> {labels as tuple: value}."""

    kind = "gauge"

    def __init__(
        self, name: str, help_text: str, collect: Callable[[], GaugeValues] | None = None
    ) -> None:
        super().__init__(name, help_text)
        self._values: dict[Labels, float] = {}
        self.collect = collect

    def set(self, value: float, **labels: str) -> None:
        with self._lock:
            self._values[_labels(labels)] = value

    def _samples(self) -> Iterable[str]:
        values = dict(self._values)
        if self.collect is not None:
            try:
                values.update(self.collect())
            except Exception as exc:  # a scrape must never kill the daemon
                log.warning("metric %s collection failed: %s", self.name, exc)
        for key, value in values.items():
            yield f"{self.name}{_fmt_labels(key)} {value:g}"


class Histogram(Metric):
    kind = "histogram"

    def __init__(
        self, name: str, help_text: str, buckets: tuple[float, ...] = LATENCY_BUCKETS
    ) -> None:
        super().__init__(name, help_text)
        self.buckets = buckets
        self._series: dict[Labels, list] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = _labels(labels)
        with self._lock:
            series = self._series.setdefault(key, [[0] * len(self.buckets), 0, 0.0])
            index = bisect.bisect_left(self.buckets, value)
            if index < len(self.buckets):
                series[0][index] += 1
            series[1] += 1
            series[2] += value

    def count(self, **labels: str) -> int:
        series = self._series.get(_labels(labels))
        return series[1] if series else 0

    def _samples(self) -> Iterable[str]:
        with self._lock:
            items = [(k, (list(v[0]), v[1], v[2])) for k, v in self._series.items()]
        for key, (counts, total, summed) in items:
            running = 0
            for bound, count in zip(self.buckets, counts, strict=True):
                running += count
                yield f"{self.name}_bucket{_fmt_labels(key, (('le', f'{bound:g}'),))} {running}"
            yield f"{self.name}_bucket{_fmt_labels(key, (('le', '+Inf'),))} {total}"
            yield f"{self.name}_sum{_fmt_labels(key)} {summed:g}"
            yield f"{self.name}_count{_fmt_labels(key)} {total}"


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {}
        self._lock = threading.Lock()

    def _add(self, metric: M) -> M:
        """The metric registered under ``metric.name`` (the first registration of a name wins;
        registering it again as another kind is a bug)."""
        with self._lock:
            found = self._metrics.setdefault(metric.name, metric)
        if not isinstance(found, type(metric)):
            raise TypeError(f"metric {metric.name} is registered as a {found.kind} already")
        return found

    def counter(self, name: str, help_text: str) -> Counter:
        return self._add(Counter(name, help_text))

    def gauge(
        self, name: str, help_text: str, collect: Callable[[], GaugeValues] | None = None
    ) -> Gauge:
        return self._add(Gauge(name, help_text, collect))

    def histogram(
        self, name: str, help_text: str, buckets: tuple[float, ...] = LATENCY_BUCKETS
    ) -> Histogram:
        return self._add(Histogram(name, help_text, buckets))

    def render(self) -> str:
        with self._lock:
            metrics = list(self._metrics.values())
        return "\n".join(line for metric in metrics for line in metric.render()) + "\n"


def labels(**items: str) -> Labels:
    """Key for a Gauge ``collect`` result."""
    return _labels(items)
