"""Failures of a learner session that a retry of the learner task would only repeat.

Prefect retries the learner task (README, "Beyond one machine, and faults"): right for a
process killed or a scheduler lost, pointless when the cause is deterministic, such as an
environment that fails every attempt the same way. The learner task's retry condition
(`tasks.runtime.task`) lets those fail the flow at once, with their message.
"""

from __future__ import annotations


class Unrecoverable(RuntimeError):
    """A failure no retry can fix (an environment that does not import where the actors
    run, say): the learner task fails without retrying. Subclass it for such failures."""
