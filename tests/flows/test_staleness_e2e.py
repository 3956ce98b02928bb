"""Issue 3's end-to-end check: a slow environment with `max_staleness: 1` shows stale
exclusions and retries with exact accounting; with admission control, no stale group."""

import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmarks are scripts that import their siblings
from staleness import run, slow_env_overrides  # noqa: E402

pytestmark = pytest.mark.e2e


def test_exit_check_excludes_and_retries_admission_control_prevents(prefect_api, tmp_path):
    exit_only = run(tmp_path / "exit", slow_env_overrides(steps=10, latency_s=0.15))
    assert exit_only["stale"] >= 1 and exit_only["retried"] >= 1, exit_only
    assert exit_only["balanced"] and exit_only["staleness_max"] <= 1

    admitted = run(tmp_path / "admission", slow_env_overrides(steps=10, latency_s=0.15)
                   + ["--set", "buffer.admission=true"])
    assert admitted["stale"] == 0 and admitted["balanced"], admitted
    assert admitted["accounting"]["consumed"] == 20
