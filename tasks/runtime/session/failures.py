"""Failures of a learner session that a retry of the learner task would only repeat.

Prefect retries the learner task (README, "Beyond one machine, and faults"): right for a
process killed or a scheduler lost, pointless when the cause is deterministic, such as an
environment that fails every attempt the same way. The learner task's retry condition
(`tasks.runtime.processes.task`) lets those fail the flow at once, with their message.
"""

from __future__ import annotations


class Unrecoverable(RuntimeError):
    """A failure no retry can fix (an environment that does not import where the actors
    run, say): the learner task fails without retrying. Subclass it for such failures."""


class CheckpointMismatch(Unrecoverable):
    """The run's checkpoints hold a train state of other shapes than the spec's (its model
    or learner section changed): every retry restores them the same way, and they are not
    damaged, so none is set aside (`tasks.runtime.state.run_state`)."""


class DiskFull(Unrecoverable):
    """A checkpoint's write ran out of disk space (ENOSPC): a retry seconds later finds the
    disk as full. Orbax writes to a temporary directory renamed once complete, so the
    checkpoints before it are intact (`tasks.runtime.state.checkpoints`)."""


class LearnerFailed(RuntimeError):
    """The learner process failed: `message` is its exception's type and text, which the
    terminal shows without this wrapping (`flows.cli.failure`)."""

    @property
    def message(self) -> str:
        return self.args[0]

    def __str__(self) -> str:  # args hold the message alone, so that it pickles as it is
        return f"learner failed: {self.message}"


class LearnerFailedUnrecoverably(LearnerFailed, Unrecoverable):
    """The learner process failed in a way no retry mends."""
