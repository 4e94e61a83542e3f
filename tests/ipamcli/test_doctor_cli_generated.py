"""`pycni doctor` under generated arguments: every run ends with exit 0 (--help) or 1 and one
clean error (a usage error or the store that is not there), never a traceback, never 2 (which
means residue). Each run ends with ``--store-path`` of a missing file, so none reaches the
kernel: the doctor opens the store before it reads anything of the node it runs in."""

from __future__ import annotations

import os

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli import cli

MISSING = "/nonexistent/pycni-doctor/store.db"
WORDS = st.sampled_from(
    ["--repair", "--network", "--cni-conf-dir", "--output", "-o", "json", "table", "yaml",
     "--config", "--etcd-endpoints", "--etcd-ca", "--store-path", "--help", "-h", "--", "-",
     "=", "--network=", "--output=json", "podnet", "/dev/null", "/nonexistent", "x" * 300]
)  # fmt: skip
ARGS = st.lists(WORDS | st.text(max_size=12), max_size=6)


@settings(
    max_examples=int(os.environ.get("PYCNI_DOCTOR_EXAMPLES", "40")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(ARGS)
def test_bad_arguments_give_a_cli_error_never_a_traceback(args):
    result = CliRunner().invoke(cli, ["doctor", *args, "--store-path", MISSING])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code in (0, 1), (args, result.exit_code, result.output)
    assert "Traceback" not in result.output and "internal error" not in result.output
    if result.exit_code:
        assert "Error:" in result.output or result.output.startswith("pycni doctor: ")
