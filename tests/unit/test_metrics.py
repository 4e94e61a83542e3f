"""The Prometheus registry renders valid text exposition and serves it on loopback."""
from __future__ import annotations

import urllib.request

from ipam.daemon.metrics import MetricsServer, Registry, labels


def test_counter_gauge_histogram_render() -> None:
    reg = Registry()
    c = reg.counter("pycni_x_total", "things")
    c.inc(plugin="ipam")
    c.inc(2, plugin="ipam")
    reg.gauge("pycni_free", "free addresses", collect=lambda: {labels(pool="p1"): 61})
    h = reg.histogram("pycni_lat_seconds", "latency", buckets=(0.001, 0.01))
    h.observe(0.0005)
    h.observe(0.005)
    h.observe(5)
    text = reg.render()
    assert '# TYPE pycni_x_total counter' in text
    assert 'pycni_x_total{plugin="ipam"} 3' in text
    assert 'pycni_free{pool="p1"} 61' in text
    assert 'pycni_lat_seconds_bucket{le="0.001"} 1' in text
    assert 'pycni_lat_seconds_bucket{le="0.01"} 2' in text
    assert 'pycni_lat_seconds_bucket{le="+Inf"} 3' in text
    assert 'pycni_lat_seconds_count 3' in text
    assert c.value(plugin="ipam") == 3 and h.count() == 3


def test_failing_collector_does_not_break_the_scrape() -> None:
    reg = Registry()
    reg.gauge("pycni_bad", "breaks", collect=lambda: 1 / 0)
    reg.counter("pycni_ok_total", "ok").inc()
    assert "pycni_ok_total 1" in reg.render()


def test_endpoint_serves_metrics_on_loopback() -> None:
    reg = Registry()
    reg.counter("pycni_served_total", "x").inc()
    server = MetricsServer(reg, "127.0.0.1:0").start()
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read()
    finally:
        server.stop()
    assert b"pycni_served_total 1" in body
