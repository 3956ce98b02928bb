"""What the buffer saw between two learner steps: the learner's waits, the actors' blocked
puts, the staleness of the groups taken, how the episodes finished meanwhile scored, and
how many of the finished groups an entry filter dropped."""

from __future__ import annotations

import dataclasses
import threading


@dataclasses.dataclass
class IntakeCounts:
    """Counters over one interval (between two `IntakeStats.pop` calls)."""

    wait_s: float = 0.0  # learner time waiting on an empty buffer
    wait_count: int = 0
    blocked_s: float = 0.0  # producer time blocked on a full buffer
    staleness: list[int] = dataclasses.field(default_factory=list)  # of consumed groups
    in_flight: list[int] = dataclasses.field(default_factory=list)  # ... gained while generated
    in_queue: list[int] = dataclasses.field(default_factory=list)  # ... gained while buffered
    episodes: int = 0  # episodes of the groups finished (buffered or filtered)
    reward_sum: float = 0.0
    successes: int = 0
    judged: int = 0  # episodes whose environment reported success
    buffered: int = 0  # groups the actors put into the buffer
    filtered: int = 0  # groups an entry filter dropped (excluded as "filtered")

    @property
    def filtered_share(self) -> float | None:
        """Of the groups that played to their end (buffered or filtered), the share a filter
        dropped: near 1 when a collapsed policy gives every episode of a group the same
        reward (README, "The run directory"). None if no group finished."""
        finished = self.buffered + self.filtered
        return self.filtered / finished if finished else None


class IntakeStats:
    """Counts added by two threads (the exchange: reports; the learner: takes and waits),
    popped by the learner's loop once per step."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts = IntakeCounts()

    def blocked(self, seconds: float) -> None:
        """An actor's time blocked on a full buffer."""
        with self._lock:
            self._counts.blocked_s += seconds

    def reported(self, report: dict) -> None:
        """An actor's report (`BufferWriter`): its group buffered or excluded, and its
        episodes' outcomes. Aborted and invalid groups count in neither the buffered nor
        the filtered: they did not play to their end."""
        with self._lock:
            c = self._counts
            if report["event"] == "buffered":
                c.buffered += 1
            elif report["event"] == "excluded" and report["reason"] == "filtered":
                c.filtered += 1
            if "episodes" in report:
                c.episodes += report["episodes"]
                c.reward_sum += report["reward_sum"]
                c.successes += report["successes"]
                c.judged += report["judged"]

    def waited(self, seconds: float) -> None:
        with self._lock:
            self._counts.wait_s += seconds
            self._counts.wait_count += 1

    def taken(self, staleness: int, in_flight: int, in_queue: int) -> None:
        with self._lock:
            self._counts.staleness.append(staleness)
            self._counts.in_flight.append(in_flight)
            self._counts.in_queue.append(in_queue)

    def pop(self) -> IntakeCounts:
        """The counts since the last pop; counting starts anew."""
        with self._lock:
            counts, self._counts = self._counts, IntakeCounts()
        return counts
