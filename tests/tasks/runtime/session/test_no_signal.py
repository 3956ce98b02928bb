"""The no-signal watch: the bounds on a wait for a batch that no arriving group fills."""

import collections

import pytest

from learner.config import LearnerConfig
from learner.trajectory import Abort, AbortKind
from tasks.buffer.intake import Exclusion
from tasks.runtime.session.no_signal import NoSignal, SignalWatch, describe


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def watch(excluded, **bounds):
    clock = Clock()
    return SignalWatch(lambda: dict(excluded), 4, LearnerConfig(**bounds), clock=clock), clock


def test_counts_only_what_was_excluded_since_the_batch_began():
    excluded = collections.Counter(filtered=1000)  # before this batch: not counted
    signal, _ = watch(excluded, max_gen_batches=2, no_signal_s=None)
    signal.batch_started()
    excluded["filtered"] += 7
    signal.raise_if_no_signal()  # 7 of 2 x 4
    excluded["invalid"] += 1
    with pytest.raises(NoSignal) as raised:
        signal.raise_if_no_signal()
    assert raised.value.excluded == {"filtered": 7, "invalid": 1}


def test_a_new_batch_counts_anew():
    excluded = collections.Counter()
    signal, _ = watch(excluded, max_gen_batches=1, no_signal_s=None)
    signal.batch_started()
    excluded["filtered"] += 3
    signal.batch_started()
    excluded["filtered"] += 3
    signal.raise_if_no_signal()  # 3 of 4 since the second batch began


def test_the_time_bound_needs_groups_that_finished_untrained():
    excluded = collections.Counter()
    signal, clock = watch(excluded, max_gen_batches=None, no_signal_s=60.0)
    signal.batch_started()
    clock.now = 600.0
    signal.raise_if_no_signal()  # nothing finished at all: a slow environment, not a dead one
    excluded["aborted"] += 1
    signal.excluded(Exclusion("aborted", "timeout after 30.0s", Abort(AbortKind.TIMEOUT, "timeout after 30.0s")))
    with pytest.raises(NoSignal) as raised:
        signal.raise_if_no_signal()
    assert raised.value.details == {"aborted": "timeout after 30.0s"} and raised.value.waited_s == 600.0


def test_both_bounds_off_never_raise():
    excluded = collections.Counter()
    signal, clock = watch(excluded, max_gen_batches=None, no_signal_s=None)
    signal.batch_started()
    excluded["filtered"] += 10**6
    clock.now = 10**6
    signal.raise_if_no_signal()


class Last:  # the fields of a `StepRecord` the message reads
    step, success_rate, train = 344, 0.92, {"entropy": 0.0049}


def test_the_message_names_the_cause_and_the_policy_s_state():
    error = NoSignal({"filtered": 250, "stale": 6}, {}, 12.3)
    line = describe(error, Last(), LearnerConfig())
    assert line.startswith("no learning signal: 256 groups finished after step 344 in 12s and none could be "
                           "trained (250 filtered, 6 stale): every group had the same reward")
    assert "entropy 0.005: the policy is deterministic at 92% success" in line
    assert "learner.max_gen_batches 16" in line


def test_a_wait_that_few_groups_ended_says_the_actors_delivered_almost_nothing():
    """As a code-exec run whose actor stalled: 8 groups in 300 s, against batches of 16."""
    few = describe(NoSignal({"filtered": 8}, {}, 300), Last(), LearnerConfig(batch_groups=16))
    assert "fewer groups than one batch (16) finished in all that time: the actors delivered almost nothing" in few
    many = describe(NoSignal({"filtered": 16}, {}, 300), Last(), LearnerConfig(batch_groups=16))
    assert "fewer groups" not in many


def test_an_aborted_cause_quotes_its_first_detail():
    error = NoSignal({"aborted": 64}, {"aborted": "episode longer than the context window (model.max_len=16)"}, 3)
    line = describe(error, None, LearnerConfig())
    assert "before the first step" in line and "every attempt was aborted, e.g. episode longer" in line


def test_the_wait_carries_the_success_of_the_episodes_excluded_since_the_batch_began():
    excluded = collections.Counter()
    signal, _ = watch(excluded, max_gen_batches=1, no_signal_s=None)
    signal.excluded(Exclusion("filtered", "zero_variance", successes=8, judged=8))  # before the batch: not counted
    signal.batch_started()
    for successes in (8, 8, 0):
        signal.excluded(Exclusion("filtered", "zero_variance", successes=successes, judged=8))
        excluded["filtered"] += 1
    signal.excluded(Exclusion("aborted", "timeout"))  # played to no end: no episodes judged
    excluded["aborted"] += 1
    with pytest.raises(NoSignal) as raised:
        signal.raise_if_no_signal()
    assert (raised.value.successes, raised.value.judged) == (16, 24)
    assert raised.value.success_rate == pytest.approx(2 / 3)
    assert NoSignal({"aborted": 4}, {}, 1.0).success_rate is None


def test_an_exclusion_reads_its_episodes_from_the_actor_s_report():
    report = {"reason": "filtered", "detail": "zero_variance", "episodes": 8, "successes": 8, "judged": 8}
    assert Exclusion.from_report(report) == Exclusion("filtered", "zero_variance", successes=8, judged=8)
    assert Exclusion.from_report({"reason": "invalid", "detail": "nan"}).judged == 0
