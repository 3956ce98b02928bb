"""The stop rule: the step target, the success target and a plateau, judged at versions."""

import dataclasses

from learner.config import LearnerConfig
from tasks.runtime.session.stopping import StopReason, StopRule


@dataclasses.dataclass
class Record:  # the fields of a `StepRecord` the rule reads
    step: int
    success_rate: float | None
    reward_mean: float = 0.0
    train: dict = dataclasses.field(default_factory=dict)


def feed(rule: StopRule, values, start: int = 1, success: bool = True) -> None:
    for step, value in enumerate(values, start=start):
        rule.observe(Record(step, value if success else None, reward_mean=value))


def test_the_step_target_ends_training_after_its_step():
    rule = StopRule(LearnerConfig(steps=5))
    assert rule.after_step(4) is None
    assert rule.after_step(5).reason == StopReason.STEPS and rule.at_version(5).reason == StopReason.STEPS


def test_the_success_target_needs_a_full_window():
    rule = StopRule(LearnerConfig(steps=100, stop_at_success=0.9, stop_window=4))
    feed(rule, [1.0, 1.0, 1.0])
    assert rule.at_version(3) is None  # three steps of four
    feed(rule, [0.7], start=4)  # (1 + 1 + 1 + 0.7) / 4 = 0.925
    assert rule.at_version(4).reason == StopReason.SUCCESS


def test_success_is_the_windowed_mean():
    rule = StopRule(LearnerConfig(steps=100, stop_at_success=0.9, stop_window=4))
    feed(rule, [1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0])  # steps 4-7: 0.875
    assert rule.at_version(7) is None
    feed(rule, [1.0], start=8)  # steps 5-8: 1.0
    stop = rule.at_version(8)
    assert stop.reason == StopReason.SUCCESS and "100.0%" in stop.message and stop.reason.reached_target


def test_a_plateau_ends_training_once_the_best_is_not_beaten_for_plateau_steps():
    rule = StopRule(LearnerConfig(steps=1000, stop_window=2, plateau_steps=10))
    feed(rule, [0.2, 0.4, 0.6, 0.8, 0.8])  # windowed: 0.3, 0.5, 0.7, 0.8 (the best, at step 5)
    feed(rule, [0.805, 0.8] * 5, start=6)  # within a point of it: no progress
    assert rule.at_version(14) is None  # 9 steps since step 5
    stop = rule.at_version(15)
    assert stop.reason == StopReason.PLATEAU and not stop.reason.reached_target
    assert "since step 5" in stop.message and "80%" in stop.message


def test_a_rise_of_a_point_restarts_the_plateau_count():
    rule = StopRule(LearnerConfig(steps=1000, stop_window=1, plateau_steps=3))
    feed(rule, [0.5, 0.5, 0.52, 0.52, 0.52])  # best 0.52 from step 3
    assert rule.at_version(5) is None
    assert rule.at_version(6).reason == StopReason.PLATEAU


def test_without_success_the_plateau_reads_the_reward():
    rule = StopRule(LearnerConfig(steps=1000, stop_window=1, plateau_steps=2))
    feed(rule, [3.0, 2.0, 2.5], success=False)
    assert rule.at_version(3).reason == StopReason.PLATEAU


def test_no_plateau_rule_unless_the_spec_sets_one():
    rule = StopRule(LearnerConfig(steps=1000, stop_window=1))
    feed(rule, [0.5] * 500)
    assert rule.at_version(500) is None


def test_a_wait_without_signal_from_a_policy_that_solves_every_prompt_is_the_success_target():
    from tasks.runtime.session.no_signal import NoSignal
    rule = StopRule(LearnerConfig(steps=1000, stop_at_success=0.95, stop_window=20))
    feed(rule, [0.9] * 20)
    last = Record(20, 0.99)
    solved = rule.no_signal(NoSignal({"filtered": 256}, {}, 3.0, successes=2040, judged=2048), last)
    assert solved.reason == StopReason.SUCCESS and "99.6% over the 2048 episodes played since step 20" in solved.message
    stuck = rule.no_signal(NoSignal({"filtered": 256}, {}, 3.0, successes=1760, judged=2048), last)
    assert stuck.reason == StopReason.NO_SIGNAL  # 86%: deterministic below the target
    failing = rule.no_signal(NoSignal({"aborted": 64}, {}, 300.0), None)
    assert failing.reason == StopReason.NO_SIGNAL
    untargeted = StopRule(LearnerConfig(steps=1000))
    assert untargeted.no_signal(NoSignal({"filtered": 256}, {}, 3.0, 2048, 2048), last).reason == StopReason.NO_SIGNAL
