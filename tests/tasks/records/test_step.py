"""A step record's `filtered_share`: the share of the groups finished since the previous
record that an entry filter dropped (README, "The run directory")."""

import types

import pytest

from tasks.buffer.stats import IntakeCounts
from tasks.records.step import StepMeter
from tasks.runtime.session.learner import Update
from tests.support.groups import make_group


def meter() -> StepMeter:
    reader = types.SimpleNamespace(depth=3)
    ledger = types.SimpleNamespace(in_flight=2, excluded={"filtered": 5}, retried=0)
    weights = types.SimpleNamespace(current=1, lag_s=0.0, interval=1)
    return StepMeter(reader, ledger, weights, types.SimpleNamespace(compiles=1))


def record(m: StepMeter, step: int, **counts):
    update = Update(step=step, metrics={"padding": 0.0, "loss": 0.1, "entropy": 0.4}, train_s=0.01)
    return m.record(update, [make_group(step, version=1)], IntakeCounts(**counts))


def test_filtered_share_is_absent_until_a_group_finishes_then_carried_between_finishes():
    """Like `reward_mean`, the acting policy's latest: a step whose batch came from the
    prefetch may see no group finish."""
    m = meter()
    first = record(m, 1)
    assert first.filtered_share is None and "filtered_share" not in first.to_json()
    assert record(m, 2, buffered=1, filtered=3).to_json()["filtered_share"] == pytest.approx(0.75)
    assert record(m, 3).filtered_share == pytest.approx(0.75)
    assert record(m, 4, buffered=4).filtered_share == 0.0
    assert record(m, 5, buffered=1, filtered=0).to_json()["entropy"] == 0.4  # the loss metrics as before
