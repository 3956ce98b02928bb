"""The run directory's `metrics.jsonl`: one JSON object per learner step, and one per
evaluated version (its own series: `{"step", "version", "time", "eval": {...scores}}`,
appended by the learner task as evaluations finish).

A line can be torn: cut short by a full disk or a power loss while it was appended, and
then, if the run went on, followed on the same line by the next record. Such a line is
skipped (its records are lost, nothing else); a resumed run says so, and drops it. A line
that is JSON but no record (`"step": null`, a string for a number, edited by hand, say)
is skipped too, with a warning, by every reader: it would end a resume or a report in a
TypeError.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable

from tasks.records.atomic import write_text_atomic
from tasks.records.step import StepRecord

_log = logging.getLogger(__name__)


class MetricsLog:
    def __init__(self, path: Path, warn: Callable[[str], None] = _log.warning):
        """`warn` is told of the lines the readers skip that are JSON but no record."""
        self.path, self.warn = path, warn

    def resume(self, step: int, warn: Callable[[str], None]) -> None:
        """Drops records past `step` (written after the checkpoint a run resumes from),
        so a resumed run replaces them rather than duplicating them; and torn or malformed
        lines, with a warning for each."""
        if not self.path.exists():
            return
        lines, torn, malformed = _parse(self.path.read_text(errors="replace"))
        for number, line in torn:
            warn(f"{self.path} line {number} is torn (not JSON: {line[:80]!r}...), written when the "
                 "run stopped mid-write (a full disk? a power loss?); dropped, with the step records it held")
        for number, line, why in malformed:
            warn(f"{self.path} line {number} is not a step record ({why}): {line[:80]!r}; dropped")
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
        """The step records, torn and malformed lines skipped."""
        return [record for record in self._all() if "eval" not in record]

    def read_evals(self) -> list[dict]:
        """The eval records, by version (the latest evaluation of each)."""
        latest = {record["version"]: record for record in self._all() if "eval" in record}
        return [latest[v] for v in sorted(latest)]

    def _all(self) -> list[dict]:
        if not self.path.exists():
            return []
        lines, _, malformed = _parse(self.path.read_text(errors="replace"))
        if malformed:  # torn lines are routine (a line being appended); these are not
            where = ", ".join(f"line {number}: {why}" for number, _, why in malformed[:3])
            more = f", and {len(malformed) - 3} more" if len(malformed) > 3 else ""
            self.warn(f"skipped {len(malformed)} line(s) of {self.path} that are JSON but no record ({where}{more})")
        return [record for record, _ in lines]


def _parse(text: str) -> tuple[list[tuple[dict, str]], list[tuple[int, str]], list[tuple[int, str, str]]]:
    """(the records with their lines, the torn lines with their numbers, the malformed
    lines with their numbers and what is wrong with them)."""
    records, torn, malformed = [], [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            torn.append((number, line))
            continue
        why = _malformed(record)
        if why is None:
            records.append((record, line))
        else:
            malformed.append((number, line, why))
    return records, torn, malformed


def _malformed(record) -> str | None:
    """What makes a JSON value no record (the fields the readers compare and sort by), or None."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    if "step" not in record:
        return "no step"
    if not _integer(record["step"]):
        return "step is not an integer"
    if "version" in record and not _integer(record["version"]):
        return "version is not an integer"
    if "eval" in record and not ("version" in record and isinstance(record["eval"], dict)):
        return "an eval record needs a version and its scores as an object"
    return None


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
