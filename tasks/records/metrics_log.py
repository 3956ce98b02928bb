"""The run directory's `metrics.jsonl`: one JSON object per learner step.

A line can be torn: cut short by a full disk or a power loss while it was appended, and
then, if the run went on, followed on the same line by the next record. Such a line is
skipped (its records are lost, nothing else); a resumed run says so, and drops it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from tasks.records.atomic import write_text_atomic
from tasks.records.step import StepRecord


class MetricsLog:
    def __init__(self, path: Path):
        self.path = path

    def resume(self, step: int, warn: Callable[[str], None]) -> None:
        """Drops records past `step` (written after the checkpoint a run resumes from),
        so a resumed run replaces them rather than duplicating them; and torn lines, with
        a warning for each."""
        if not self.path.exists():
            return
        lines, torn = _parse(self.path.read_text(errors="replace"))
        for number, line in torn:
            warn(f"{self.path} line {number} is torn (not JSON: {line[:80]!r}...), written when the "
                 "run stopped mid-write (a full disk? a power loss?); dropped, with the step records it held")
        kept = [line for record, line in lines if record["step"] <= step]
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))

    def write(self, record: StepRecord) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record.to_json()) + "\n")

    def read(self) -> list[dict]:
        """The records, torn lines skipped."""
        if not self.path.exists():
            return []
        return [record for record, _ in _parse(self.path.read_text(errors="replace"))[0]]


def _parse(text: str) -> tuple[list[tuple[dict, str]], list[tuple[int, str]]]:
    """(the records with their lines, the torn lines with their numbers)."""
    records, torn = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            torn.append((number, line))
            continue
        if isinstance(record, dict) and "step" in record:
            records.append((record, line))
        else:
            torn.append((number, line))
    return records, torn
