"""How many cases each property runs: a hypothesis profile chosen by PYCNI_FUZZ_PROFILE.

- ``ci`` (default, `make test`): a few hundred cases over the whole suite, no shrinking, so a
  defect costs seconds, not minutes; the falsifying example is printed as found.
- ``fuzz`` (`make fuzz`): 50x the cases and full shrinking, for a minimal reproduction. Replay
  a run with ``make fuzz SEED=<the seed it printed>``.

No example database (nothing is written into the repository). The profiles are looked up
explicitly by each test, never loaded globally, so other suites keep their own settings.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

PROFILE = os.environ.get("PYCNI_FUZZ_PROFILE", "ci")
SCALE = {"ci": 1, "fuzz": 50}  # ci: ~330 cases in all; fuzz: ~16,000

settings.register_profile(
    "ci",
    deadline=None,
    database=None,
    print_blob=True,
    max_examples=1,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
)
settings.register_profile(
    "fuzz", settings.get_profile("ci"), phases=[Phase.explicit, Phase.generate, Phase.shrink]
)

if PROFILE not in SCALE:
    raise RuntimeError(f"PYCNI_FUZZ_PROFILE={PROFILE!r}: expected one of {sorted(SCALE)}")


def cases(n: int, **overrides) -> settings:
    """Settings for a property that runs ``n`` cases in `make test` (and 50 n in `make fuzz`)."""
    return settings(settings.get_profile(PROFILE), max_examples=n * SCALE[PROFILE], **overrides)
