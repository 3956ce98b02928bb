"""The run directory's metrics log: one JSON object per learner step."""

from __future__ import annotations

import json
import os
from pathlib import Path


class MetricsLog:
    def __init__(self, path: Path):
        self.path = path

    def truncate_after(self, step: int) -> None:
        """Drops records past `step` (written after the checkpoint a run resumes from),
        so a resumed run replaces them rather than duplicating them."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def append(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
