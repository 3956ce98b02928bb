"""A run's versions table: one row per checkpointed or evaluated version, its eval
scores beside its checkpoint (a version evaluated without a checkpoint has a row too);
and how Prefect shows it (pure, so tests check it by hand): the table's rows in a
readable form, and the lineage as a Mermaid diagram in Markdown (README, "The Prefect UI").
"""

from __future__ import annotations

import datetime
import math

EVAL_COLUMNS = ("success_rate", "reward_mean", "length_mean", "prompts", "episodes")
# A version's columns, in the order the table shows them; then its eval scores.
WARMUP_PARENT = "warm-up"  # the parent of a run's first version when a warm-up made its weights (version 0)
VERSION_COLUMNS = ("version", "step", "parent", "checkpoint", "time", "reward_mean")
LINEAGE_VERSIONS = 30  # versions drawn in the lineage diagram: the latest, past an ellipsis


class VersionTable:
    def __init__(self, rows: list[dict] = (), scores: list[dict] = ()):
        """`rows`: the checkpointed versions' (`tasks.run_dir.RunDir.versions_table`);
        `scores`: evaluations recorded before (a resumed run's, `tasks.eval.results`)."""
        self._rows: dict[int, dict] = {}
        self.add_rows(rows)
        for line in scores:
            self.add_eval(line)

    def add_rows(self, rows: list[dict]) -> None:
        """Checkpointed versions' rows (`tasks.runtime.state.run_state`); their eval columns stay."""
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


def readable_rows(rows: list[dict]) -> list[dict]:
    """`rows` (`VersionTable.rows`) as the Prefect UI should show them: by version, every
    row with the same columns in the same order (the UI takes its columns from the first
    row: a version without eval scores first hid every score), times in UTC ISO 8601,
    numbers to 3 significant digits."""
    columns = [*VERSION_COLUMNS, *_eval_columns(rows)]
    return [{column: _readable(column, row.get(column)) for column in columns}
            for row in sorted(rows, key=lambda row: row["version"])]


def _eval_columns(rows: list[dict]) -> list[str]:
    """The eval columns any row has: success and reward first, then pass@k, then the counts."""
    present = {column for row in rows for column in row if column.startswith("eval_")}
    order = [f"eval_{name}" for name in EVAL_COLUMNS[:2]] + sorted(c for c in present if c.startswith("eval_pass_at_"))
    order += [f"eval_{name}" for name in EVAL_COLUMNS[2:]]
    return [column for column in order if column in present] + sorted(present - set(order))


def _readable(column: str, value):
    if value is None:
        return None
    if column == "time":
        return datetime.datetime.fromtimestamp(value, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, float):
        return significant(value)
    return value


def significant(x: float, digits: int = 3) -> float:
    """`x` rounded to `digits` significant digits (0.8125 -> 0.812, 1234.5 -> 1230.0)."""
    if not math.isfinite(x) or x == 0:
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def lineage_markdown(run_name: str, rows: list[dict], table_key: str, shown: int = LINEAGE_VERSIONS) -> str:
    """The run's lineage as Markdown with a Mermaid flowchart (the Prefect UI renders a
    ```mermaid fence): spec -> v1 -> v2 -> ... in version order, each evaluated version
    with its eval score beside it; past `shown` versions, only the latest `shown`, after
    an ellipsis, so that a run of hundreds stays readable."""
    rows = sorted(rows, key=lambda row: row["version"])
    drawn, hidden = rows[-shown:], rows[:-shown]
    lines = ["flowchart TD", '  spec["spec.yaml"]']
    previous = "spec"
    if rows and rows[0].get("parent") == WARMUP_PARENT:  # data -> warm-up -> v0 -> v1 ...
        lines += ['  data[("demonstrations")] --> v0', '  spec --> v0["v0 · warm-up"]']
        previous = "v0"
    if hidden:
        lines.append(f'  {previous} --> earlier["… {len(hidden)} earlier versions (v{hidden[0]["version"]} to '
                     f'v{hidden[-1]["version"]})"]')
        previous = "earlier"
    for row in drawn:
        node = f"v{row['version']}"
        lines.append(f'  {previous} --> {node}["{_version_label(row)}"]')
        if row.get("eval_success_rate") is not None:
            lines.append(f'  {node} -.- e{row["version"]}(["{_eval_label(row)}"])')
        previous = node
    checkpointed = sum(row.get("checkpoint") is not None for row in rows)
    return "\n".join([
        f"# Lineage of run {run_name}",
        "",
        f"{len(rows)} versions ({checkpointed} with a checkpoint), each trained from the one before; "
        f"round nodes: eval scores. Every version's checkpoint, parent and scores: the `{table_key}` table.",
        "",
        "```mermaid", *lines, "```", ""])


def _version_label(row: dict) -> str:
    kept = "" if row.get("checkpoint") is not None else "<br/>no checkpoint"
    return f"v{row['version']} · step {row['step']}{kept}"


def _eval_label(row: dict) -> str:
    reward = row.get("eval_reward_mean")
    return f"eval v{row['version']}: success {row['eval_success_rate']:.0%}" + (
        f", reward {significant(float(reward))}" if reward is not None else "")
