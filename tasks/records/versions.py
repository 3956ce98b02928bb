"""The `model-versions` table: one row per checkpointed or evaluated version, its eval
scores beside its checkpoint (a version evaluated without a checkpoint has a row too)."""

from __future__ import annotations

EVAL_COLUMNS = ("success_rate", "reward_mean", "length_mean", "prompts", "episodes")


class VersionTable:
    def __init__(self, scores: list[dict] = ()):
        """`scores`: evaluations recorded before (a resumed run's, `tasks.eval.results`)."""
        self._rows: dict[int, dict] = {}
        for line in scores:
            self.add_eval(line)

    def add_rows(self, rows: list[dict]) -> None:
        """Checkpointed versions' rows (`tasks.runtime.run_state`); their eval columns stay."""
        for row in rows:
            self._rows[row["version"]] = {**self._rows.get(row["version"], {}), **row}

    def add_eval(self, line: dict) -> None:
        """A version's eval scores line, as `eval_<score>` columns."""
        row = self._rows.setdefault(line["version"], {"version": line["version"], "step": line["step"],
                                                      "checkpoint": line.get("checkpoint")})
        row |= {f"eval_{name}": line[name] for name in EVAL_COLUMNS if name in line}
        row |= {f"eval_{name}": value for name, value in line.items() if name.startswith("pass_at_")}

    def rows(self) -> list[dict]:
        return [self._rows[v] for v in sorted(self._rows)]
