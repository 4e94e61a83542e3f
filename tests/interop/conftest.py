"""Interop fixtures: the libcni driver (built once per session with Debian's Go) and
runners for it and for `pycni net`, both executing inside the test's node namespace."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.fixtures.cnirun import Runner, ToolchainMissing, build_go_driver


@pytest.fixture(scope="session")
def go_driver(tmp_path_factory) -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    try:
        return build_go_driver(str(tmp_path_factory.mktemp("cnidriver")))
    except ToolchainMissing as exc:
        pytest.skip(str(exc))


def require_pycni_plugin(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} has not landed yet")


@pytest.fixture
def make_runner(node, tmp_path, cni_path, request):
    """make_runner(kind) -> Runner sharing one conf dir and cache dir per test."""
    conf_dir, cache_dir = str(tmp_path / "net.d"), str(tmp_path / "cache")

    def make(kind: str) -> Runner:
        driver = request.getfixturevalue("go_driver") if kind == "go" else ""
        return Runner(kind, node, conf_dir, cache_dir, cni_path, driver)

    return make
