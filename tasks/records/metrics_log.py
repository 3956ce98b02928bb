"""The run directory's `metrics.jsonl`: one JSON object per learner step."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.records.atomic import write_text_atomic
from tasks.records.step import StepRecord


class MetricsLog:
    def __init__(self, path: Path):
        self.path = path

    def resume(self, step: int) -> None:
        """Drops records past `step` (written after the checkpoint a run resumes from),
        so a resumed run replaces them rather than duplicating them."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= step]
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))

    def write(self, record: StepRecord) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record.to_json()) + "\n")

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
