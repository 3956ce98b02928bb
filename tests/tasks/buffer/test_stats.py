"""The share of finished groups an entry filter dropped, counted from the actors' reports
(README, "The run directory": `filtered_share`)."""

import pytest

from tasks.buffer.stats import IntakeStats
from tasks.buffer.writer import outcomes
from tests.support.groups import make_group


def buffered(prompt_id: int) -> dict:
    """A report as `BufferWriter.flush` sends it for a group put into the buffer."""
    group = make_group(prompt_id, (0.0, 1.0))
    return {"event": "buffered", "actor": 0, "id": prompt_id, "attempt": 0, **outcomes(group)}


def excluded(prompt_id: int, reason: str, detail: str) -> dict:
    """A report of a group the entry checks excluded; only a filtered group played to its end."""
    report = {"event": "excluded", "actor": 0, "id": prompt_id, "attempt": 0, "reason": reason, "detail": detail}
    if reason == "filtered":
        report.update(outcomes(make_group(prompt_id, (1.0, 1.0))))
    return report


def test_filtered_share_counts_buffered_and_filtered_groups_only():
    """Aborted and invalid groups are neither: they say nothing of the policy's entropy."""
    stats = IntakeStats()
    stats.reported({"event": "hello", "actor": 0})
    for prompt_id in range(3):
        stats.reported(buffered(prompt_id))
    stats.reported(excluded(3, "filtered", "zero_variance"))
    stats.reported(excluded(4, "filtered", "zero_variance"))
    stats.reported(excluded(5, "aborted", "timeout"))
    stats.reported(excluded(6, "invalid", "too long"))

    counts = stats.pop()
    assert (counts.buffered, counts.filtered) == (3, 2)
    assert counts.filtered_share == pytest.approx(2 / 5)
    assert counts.episodes == 10  # the acting policy's episodes: buffered and filtered groups, 2 each


def test_filtered_share_is_none_when_no_group_finished_since_the_last_pop():
    stats = IntakeStats()
    stats.reported(excluded(0, "filtered", "zero_variance"))
    assert stats.pop().filtered_share == 1.0
    stats.reported(excluded(1, "aborted", "timeout"))
    assert stats.pop().filtered_share is None
