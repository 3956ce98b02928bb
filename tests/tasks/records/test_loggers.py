"""The learner's progress line (the learner task's log in Prefect): entropy and the filtered
share beside the reward, marked past their warning levels (README, "The two commands")."""

from tasks.records.loggers import Progress
from tasks.records.warnings import ENTROPY_WARN, FILTERED_WARN


def progress(**fields) -> Progress:
    return Progress(**{"step": 12, "version": 3, "reward_mean": 0.5, "success_rate": 0.25, "buffered": 7,
                       "learner_busy": 0.9, "loss": 0.1, "entropy": 0.43, "filtered_share": 0.375, **fields})


def test_line_shows_entropy_and_the_filtered_share():
    line = progress().line()
    assert line == ("step 12 version 3 | reward 0.500 success 25% | entropy 0.43 | filtered 38% | "
                    "buffered 7 | learner busy 90% | loss 0.1000")


def test_line_marks_what_crossed_its_warning_level():
    line = progress(entropy=0.05, filtered_share=0.92).line()
    assert "| entropy 0.05! | filtered 92%! |" in line
    # Entropy warns below its level (`no_signal` calls the policy deterministic there), the
    # share from its level on: 4 groups of 5 dropped is already 80%.
    at_levels = progress(entropy=ENTROPY_WARN, filtered_share=FILTERED_WARN).line()
    assert "| entropy 0.1 | filtered 80%! |" in at_levels
    # Two significant digits: near the level, a value just under it does not read as on it.
    assert "| entropy 0.095! |" in progress(entropy=0.0951).line()


def test_line_leaves_out_what_is_not_known_yet():
    """No group finished yet (no share), or a loss that reports no entropy."""
    line = progress(entropy=None, filtered_share=None).line()
    assert line == "step 12 version 3 | reward 0.500 success 25% | buffered 7 | learner busy 90% | loss 0.1000"


def test_of_a_record_takes_entropy_from_the_loss_metrics():
    from tests.tasks.records.test_step import meter, record

    step = record(meter(), 1, buffered=3, filtered=1)
    assert (Progress.of(step).entropy, Progress.of(step).filtered_share) == (0.4, 0.25)
