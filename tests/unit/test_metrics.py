"""The Prometheus registry renders valid text exposition and serves it on loopback."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import urllib.request

from common.metrics import Registry, labels
from pycnid.metrics_server import MetricsServer
from tests.fixtures.waiting import wait_for


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
    assert "# TYPE pycni_x_total counter" in text
    assert 'pycni_x_total{plugin="ipam"} 3' in text
    assert 'pycni_free{pool="p1"} 61' in text
    assert 'pycni_lat_seconds_bucket{le="0.001"} 1' in text
    assert 'pycni_lat_seconds_bucket{le="0.01"} 2' in text
    assert 'pycni_lat_seconds_bucket{le="+Inf"} 3' in text
    assert "pycni_lat_seconds_count 3" in text
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


def hang_up_after_request(port: int) -> None:
    """Send a scrape request, then reset the connection (SO_LINGER 0: RST, not FIN)."""
    client = socket.create_connection(("127.0.0.1", port))
    client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()


def test_a_scraper_that_hangs_up_is_a_debug_line_not_a_traceback(capfd, caplog) -> None:
    reg = Registry()
    gone = threading.Event()
    many = {labels(n=str(i)): i for i in range(20000)}  # ~500 KB: more than a socket buffers
    reg.gauge(
        "pycni_big", "rendered once the scraper has left", lambda: many if gone.wait(10) else {}
    )
    server = MetricsServer(reg, "127.0.0.1:0").start()
    try:
        with caplog.at_level(logging.DEBUG, logger="pycnid.metrics"):
            hang_up_after_request(server.port)
            gone.set()
            wait_for(
                "the hang-up in the log",
                lambda: [r for r in caplog.records if "hung up" in r.getMessage()],
            )
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=5).read()
    finally:
        server.stop()
    assert b'pycni_big{n="19999"} 19999' in body  # still serving
    assert {r.levelno for r in caplog.records if r.name == "pycnid.metrics"} == {logging.DEBUG}
    assert "Traceback" not in capfd.readouterr().err
