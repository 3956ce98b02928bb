"""The learner task's retries (a real Prefect server): a failure no retry can fix, such as
a run that cannot make progress, fails the flow at once; others are retried."""

import pytest
from prefect import flow, task

from tasks.runtime.processes import task as task_module
from tasks.runtime.session.no_progress import NoProgress

calls = []


@task(retries=2, retry_delay_seconds=0, retry_condition_fn=task_module.learn.retry_condition_fn,
      persist_result=False)
def fails_with(error: Exception) -> None:
    calls.append(type(error).__name__)
    raise error


@flow
def run_once(error: Exception) -> None:
    fails_with(error)


@pytest.mark.parametrize("error, attempts", [
    (NoProgress("no progress is possible: ..."), 1),
    (RuntimeError("learner process died (exit code -9)"), 3),
])
def test_only_failures_a_retry_can_fix_are_retried(prefect_api, error, attempts):
    calls.clear()
    assert run_once(error, return_state=True).is_failed()
    assert len(calls) == attempts


def test_the_learner_s_no_progress_error_reaches_the_task_as_unrecoverable():
    error = NoProgress("no progress is possible")
    assert task_module.permanent(error)
    events = iter([("error", (f"NoProgress: {error}", task_module.permanent(error)))])

    class Events:
        gone = False

        def get(self, timeout_s):
            return next(events)

    with pytest.raises(task_module.Unrecoverable, match="learner failed: NoProgress: no progress is possible"):
        task_module._relay(Events(), None, None, None, type("Stop", (), {"set": lambda self: None})(),
                           type("Records", (), {"collect": lambda self, wait_s=0.0: None})())
