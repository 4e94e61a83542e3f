"""`make bench-svc` makes pycni's runs several times: the figure is the run whose full sync
took the median time (the lower middle of an even count), whole (its render/apply split is
that run's), with every run's full sync time in order and every run's update rounds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bench.svc import calc_median_run, full_seconds

times = st.floats(min_value=0.0, max_value=5.0, allow_nan=False)
updates = st.lists(st.fixed_dictionaries({"render": times, "apply": times}), max_size=3)
runs = st.lists(
    st.fixed_dictionaries(
        {"render": times, "apply": times, "elements": st.just(1), "updates": updates}
    ),
    min_size=1,
    max_size=5,
)


@given(made=runs)
def test_the_median_run_stands_for_the_runs(made: list[dict]) -> None:
    one = calc_median_run(made)
    ranked = sorted(full_seconds(run) for run in made)
    assert full_seconds(one) == ranked[(len(made) - 1) // 2]
    assert one["full_runs"] == [full_seconds(run) for run in made]
    assert one["updates"] == [u for run in made for u in run["updates"]]
    assert any(one["render"] == r["render"] and one["apply"] == r["apply"] for r in made)
