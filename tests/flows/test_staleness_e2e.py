"""End to end, a slow environment and a learner that publishes every step: with
`max_staleness: 1` the exit check excludes stale groups and retries their prompts with exact
accounting; with admission control, no group goes stale at all."""

import json

import pytest

from tasks.buffer.ledger import balanced
from tests.conftest import tandem

pytestmark = pytest.mark.e2e

SLOW = ["learner.steps=10", "learner.batch_groups=2", "sync.interval=1", "buffer.capacity=16",
        "buffer.max_staleness=1", "buffer.max_retries=10", "actors.groups_per_worker=4", "env.latency_s=0.15",
        "checkpoint.every=1000"]


def run(run_dir, *extra: str) -> tuple[list[dict], dict]:
    sets = [arg for s in (*SLOW, *extra, f"checkpoint.dir={run_dir}") for arg in ("--set", s)]
    result = tandem("run", "specs/guess-number.yaml", *sets)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return metrics, json.loads((run_dir / "accounting.json").read_text())


@pytest.mark.slow  # 82 s on 2 cores: CI's time (README, "The two commands")
def test_exit_check_excludes_and_retries_admission_control_prevents(prefect_api, tmp_path):
    metrics, accounting = run(tmp_path / "exit", "buffer.admission=false")  # the spec has it on
    assert accounting["excluded"].get("stale", 0) >= 1 and accounting["retried"] >= 1, accounting
    assert balanced(accounting) and max(m["staleness_max"] for m in metrics) <= 1

    metrics, accounting = run(tmp_path / "admission", "buffer.admission=true")
    assert accounting["excluded"].get("stale", 0) == 0 and balanced(accounting), accounting
    assert accounting["consumed"] == 20 and max(m["staleness_max"] for m in metrics) <= 1
