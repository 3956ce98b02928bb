"""Eval scores, against counts made by hand."""

import pytest

from learner.trajectory import Abort, AbortKind, Group
from tasks.eval.scores import score
from tests.support.groups import make_group


def test_scores_of_greedy_episodes():
    groups = [make_group(0, (1.0,), success=True), make_group(1, (0.0,), success=True),
              Group(2, "p", (), 0.0, 0.0, aborted=Abort(AbortKind.ENV_ERROR, "env error: E: x", about="E"))]
    s = score(groups, k=1)
    assert (s["prompts"], s["episodes"], s["aborted"]) == (3, 3, 1)
    assert s["reward_mean"] == pytest.approx(1 / 3) and s["success_rate"] == pytest.approx(1 / 3)
    assert s["pass_at_1"] == pytest.approx(1 / 3)
    assert (s["length_mean"], s["turns_mean"]) == (6.0, 3.0)  # 6 tokens alternating: 3 actions


def test_pass_at_k_counts_prompts_with_any_success():
    groups = [make_group(0, (0.0, 0.0, 1.0, 0.0)), make_group(1, (0.0,) * 4), make_group(2, (1.0, 1.0, 0.0, 0.0))]
    s = score(groups, k=4)
    assert s["pass_at_4"] == pytest.approx(2 / 3)  # success = positive reward without info["success"]
    assert s["success_rate"] == pytest.approx(3 / 12) and s["episodes"] == 12
