"""The store-backed IPAM gauges come from the last good snapshot: a scrape never
calls the store, so a store that hangs or fails leaves the scrape as fast as ever, with the old
figures, their age and the failure gauge. A real SqliteStore behind a switchable fault (the
store is the slow edge a unit test may fake); the refresh thread is common/loop.py."""

from __future__ import annotations

import logging
import threading

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cni.spec.errors import InvalidConfig, TryAgainLater
from common.loop import Periodic
from common.metrics import Registry
from ipam.leases.metrics import IpamMetrics, start_ipam_metrics
from plugins.ipam.config import parse_daemon_options
from pycnid.wiring import Lifecycle
from store.sqlite import SqliteStore
from tests.fixtures.ipam_pools import put_pool
from tests.fixtures.waiting import wait_for

SIZE = 'pycni_ipam_pool_size{pool="pa"}'
AGE = "pycni_ipam_usage_age_seconds"
FAILED = "pycni_ipam_usage_refresh_failed"
GUARD = 10  # seconds: a hang guard for threads, never a performance bound


class FaultyStore:
    """Forwards to a real store until told to hang (block until released) or to raise."""

    def __init__(self, store: SqliteStore) -> None:
        self.store, self.mode, self.calls = store, "ok", 0
        self.entered, self.release = threading.Event(), threading.Event()

    def range(self, prefix: str, **kw):
        self.calls += 1
        if self.mode == "hang":
            self.entered.set()
            assert self.release.wait(GUARD), "the hanging store was never released"
            raise TryAgainLater("etcd request timed out", "no answer within 2.5 s")
        if self.mode == "raise":
            raise TryAgainLater("etcd is unreachable", "connection refused")
        if self.mode == "bug":
            raise RuntimeError("a bug in the reader")
        return self.store.range(prefix, **kw)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def faulty(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"))
    put_pool(store, "pa", "10.95.0.0/24", block_size=26)
    yield FaultyStore(store)
    store.close()


def samples(registry: Registry) -> dict[str, float]:
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in registry.render().splitlines())
        if name and not name.startswith("#")
    }


def render_in_thread(registry: Registry) -> dict[str, float]:
    """Render in a thread joined with a hang guard: a scrape that waited on the store would
    still be running."""
    out: dict[str, dict[str, float]] = {}
    thread = threading.Thread(target=lambda: out.update(got=samples(registry)), daemon=True)
    thread.start()
    thread.join(GUARD)
    assert not thread.is_alive(), "the scrape waited on the store"
    return out["got"]


def test_a_scrape_never_calls_the_store(faulty):
    registry, clock = Registry(), Clock()
    metrics = IpamMetrics(registry, faulty, clock=clock)
    metrics.refresh()
    reads = faulty.calls
    for _ in range(3):
        assert samples(registry)[SIZE] == 254
    assert faulty.calls == reads


def test_scrape_answers_with_the_old_figures_while_the_store_hangs(faulty):
    registry, clock = Registry(), Clock()
    metrics = IpamMetrics(registry, faulty, clock=clock)
    metrics.refresh()
    faulty.mode = "hang"
    refresher = threading.Thread(target=metrics.refresh, daemon=True)
    refresher.start()
    assert faulty.entered.wait(GUARD)  # the background read is stuck in the store
    clock.now += 7
    during = render_in_thread(registry)
    assert during[SIZE] == 254 and during[AGE] == 7 and during[FAILED] == 0
    faulty.release.set()  # the store's timeout: the read fails
    refresher.join(GUARD)
    after = render_in_thread(registry)
    assert after[SIZE] == 254 and after[AGE] == 7 and after[FAILED] == 1


def test_a_failing_store_keeps_the_figures_flags_them_and_recovers(faulty, caplog):
    registry, clock = Registry(), Clock()
    metrics = IpamMetrics(registry, faulty, clock=clock)
    metrics.refresh()
    faulty.mode = "raise"
    with caplog.at_level(logging.INFO, logger="pycnid.ipam"):
        for _ in range(3):
            clock.now += 10
            metrics.refresh()
    got = samples(registry)
    assert got[SIZE] == 254 and got[AGE] == 30 and got[FAILED] == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "connection refused" in warnings[0].getMessage()
    faulty.mode = "ok"
    put_pool(faulty.store, "pb", "10.96.0.0/24", block_size=26)
    metrics.refresh()
    got = samples(registry)
    assert got[AGE] == 0 and got[FAILED] == 0 and got['pycni_ipam_pool_size{pool="pb"}'] == 254


def test_a_bug_in_the_read_is_logged_with_its_stack_and_flagged(faulty, caplog):
    registry = Registry()
    metrics = IpamMetrics(registry, faulty)
    faulty.mode = "bug"
    metrics.refresh()
    assert samples(registry)[FAILED] == 1 and SIZE not in samples(registry)
    assert any(r.exc_info and r.levelno == logging.ERROR for r in caplog.records)


def test_before_the_first_good_read_the_age_counts_from_the_start(faulty):
    registry, clock = Registry(), Clock()
    metrics = IpamMetrics(registry, faulty, clock=clock)
    faulty.mode = "raise"
    metrics.refresh()
    clock.now += 5
    got = samples(registry)
    assert got[AGE] == 5 and got[FAILED] == 1 and SIZE not in got


def services_with(registry: Registry) -> Lifecycle:
    return Lifecycle("node1", registry)


class Leases:  # what attach() feeds: four hooks
    on_conflict = on_retry = on_event = on_latency = None


def test_the_refresh_thread_runs_when_served_and_stops_on_shutdown(faulty):
    registry = Registry()
    services = services_with(registry)
    metrics = start_ipam_metrics(services, faulty, Leases(), 0.01, serve=True)
    assert len(services.on_shutdown) == 1
    assert "ipam-metrics" in {t.name for t in threading.enumerate()}
    wait_for("the first snapshot", lambda: SIZE in samples(registry), GUARD, step=0.01)
    faulty.mode = "raise"
    wait_for("a round on the failing store", lambda: metrics.failed, GUARD, step=0.01)
    services.on_shutdown[0]()
    assert "ipam-metrics" not in {t.name for t in threading.enumerate()}
    assert samples(registry)[SIZE] == 254 and samples(registry)[FAILED] == 1


def test_no_refresh_thread_without_a_metrics_endpoint(faulty):
    services = services_with(Registry())
    start_ipam_metrics(services, faulty, Leases(), 30, serve=False)
    assert services.on_shutdown == [] and faulty.calls == 0


@pytest.mark.parametrize("interval", [0, 0.0])
def test_a_zero_interval_is_refused(faulty, interval):
    with pytest.raises(InvalidConfig, match="ipam.metricsInterval"):
        start_ipam_metrics(services_with(Registry()), faulty, Leases(), interval, serve=True)


@given(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=5),
        st.lists(st.integers(), max_size=2),
    )
)
@example(float("nan"))
@example(float("inf"))
@example(10**400)
def test_metrics_interval_is_a_number_of_seconds_or_refused(value):
    try:
        options = parse_daemon_options({"ipam": {"metricsInterval": value}})
    except InvalidConfig as err:
        assert "ipam.metricsInterval" in err.msg
    else:
        assert 0 <= options.metrics_interval < float("inf")


def test_periodic_runs_at_once_survives_a_bug_and_stops(caplog):
    rounds: list[int] = []
    done = threading.Event()

    def run() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise RuntimeError("first round breaks")
        if len(rounds) == 3:
            done.set()

    loop = Periodic("test-periodic", 0.001, run).start()
    assert done.wait(GUARD)
    loop.stop()
    assert not loop._thread.is_alive() and len(rounds) >= 3
    assert any("first round breaks" in (r.exc_text or str(r.exc_info)) for r in caplog.records)
