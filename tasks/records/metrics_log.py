"""The run directory's `metrics.jsonl`: one JSON object per learner step, and one per
evaluated version (its own series: `{"step", "version", "time", "eval": {...scores}}`,
appended by the learner task as evaluations finish).

A line can be torn: cut short by a full disk or a power loss while it was appended, and
then, if the run went on, followed on the same line by the next record. Such a line is
skipped (its records are lost, nothing else); a resumed run says so, and drops it.
"""

from __future__ import annotations

import json
import time
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

    def append_eval(self, *, step: int, version: int, scores: dict) -> dict:
        """Appends a version's eval scores (one write: whole beside the learner's lines)."""
        record = {"step": step, "version": version, "time": time.time(), "eval": scores}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return record

    def read(self) -> list[dict]:
        """The step records, torn lines skipped."""
        return [record for record in self._all() if "eval" not in record]

    def read_evals(self) -> list[dict]:
        """The eval records, by version (the latest evaluation of each)."""
        latest = {record["version"]: record for record in self._all() if "eval" in record}
        return [latest[v] for v in sorted(latest)]

    def _all(self) -> list[dict]:
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
