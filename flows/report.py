"""`tandem report RUN_DIR`: plots of a run's `metrics.jsonl`, for people and for Prefect.

The same PNGs go to `RUN_DIR/report/` and, through `publish_report` at the end of a
flow run, into the `run-summary` artifact; `RUN_DIR/tensorboard/` gets the metrics as
TensorBoard events.
"""

from __future__ import annotations

import functools
import io
import json
import math
import sys
from pathlib import Path
from typing import Callable

from matplotlib.figure import Figure
from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.eval.results import best_version, read_scores
from tasks.records.artifacts import record_summary
from tasks.records.metrics_log import MetricsLog
from tasks.records.tensorboard import rewrite_eval_events, rewrite_events
from tasks.records.warnings import ENTROPY_WARN, FILTERED_WARN, first_crossing
from tasks.run_dir import RunDir

# A Figure made without pyplot renders through matplotlib's Agg canvas: no display,
# no global figure state, safe in worker threads.
FIGSIZE = (6.4, 3.6)
DPI = 90


def _reward(fig: Figure, records: list[dict], evals: list[dict] = (), end: dict | None = None) -> None:
    start = records[0]["time"]
    axes = fig.subplots(1, 2, sharey=True)
    _evals(axes, evals, start)
    _run_end(axes, records, end, start)
    for ax, xs, label in ((axes[0], [r["step"] for r in records], "step"),
                          (axes[1], [r["time"] - start for r in records], "wall time (s)")):
        # Where reward is 1 for a win and 0 otherwise the two curves coincide: success is
        # drawn wide and pale underneath, so the reward line shows on top of it.
        if any("success_rate" in r for r in records):
            pairs = [(x, r["success_rate"]) for x, r in zip(xs, records) if "success_rate" in r]
            ax.plot(*zip(*pairs), label="success rate", color="tab:orange", linewidth=5, alpha=0.4)
        ax.plot(xs, [r["reward_mean"] for r in records], label="reward (mean)", color="tab:blue", linewidth=1.2)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize="small")
    fig.suptitle("Reward and success")


def _learner_busy(fig: Figure, records: list[dict]) -> None:
    ax = fig.subplots()
    ax.plot([r["step"] for r in records], [100 * r["learner_busy"] for r in records])
    ax.set(xlabel="step", ylabel="% of wall time in train steps", ylim=(0, 105),
           title="Learner busy")
    ax.grid(alpha=0.3)


def _buffer_depth(fig: Figure, records: list[dict]) -> None:
    ax = fig.subplots()
    ax.step([r["step"] for r in records], [r["buffer_depth"] for r in records], where="post")
    ax.set(xlabel="step", ylabel="groups buffered", title="Buffered groups (queued or prefetched)")
    ax.grid(alpha=0.3)


def _staleness(fig: Figure, records: list[dict]) -> None:
    """Staleness of every consumed group, summed over the run's steps."""
    counts: dict[int, int] = {}
    for r in records:
        for staleness, n in r.get("staleness_hist", {}).items():
            counts[int(staleness)] = counts.get(int(staleness), 0) + n
    ax = fig.subplots()
    ax.bar(list(counts), list(counts.values()))
    ax.set(xlabel="staleness (versions)", ylabel="groups consumed", title="Staleness of consumed groups")
    ax.set_xticks(sorted(counts) or [0])
    if not counts:
        ax.text(0.5, 0.5, "no groups recorded", transform=ax.transAxes, ha="center")


def _exclusions(fig: Figure, records: list[dict], excluded: dict[str, int] | None = None) -> None:
    """The run's totals: `excluded` (from `accounting.json`, written when the run ends), else
    the last record's (cumulative, but groups keep finishing after the last step)."""
    excluded = records[-1].get("excluded", {}) if excluded is None else excluded
    ax = fig.subplots()
    ax.barh(list(excluded), list(excluded.values()))
    ax.set(xlabel="groups excluded", title=f"Exclusions by reason (total {sum(excluded.values())})")
    if not excluded:
        ax.text(0.5, 0.5, "no group was excluded", transform=ax.transAxes, ha="center")
        ax.set_yticks([])


def _evals(axes, evals: list[dict], start: float) -> None:
    """The eval curve (held-out success, by version) beside training's, the best version starred."""
    if not evals:
        return
    best = best_version([{"version": e["version"], **e["eval"]} for e in evals])
    for ax, x in ((axes[0], lambda e: e["step"]), (axes[1], lambda e: e["time"] - start)):
        ax.plot([x(e) for e in evals], [e["eval"]["success_rate"] for e in evals], "o-", color="tab:green",
                markersize=3, linewidth=1, label="eval success (held out)")
        chosen = next(e for e in evals if e["version"] == best["version"])
        ax.plot([x(chosen)], [best["success_rate"]], "*", color="tab:red", markersize=12,
                label=f"best: version {best['version']}")


def _run_end(axes, records: list[dict], end: dict | None, start: float) -> None:
    """Where the run ended (`run_end`), on the step and wall-time axes."""
    if end is None or "step" not in end:
        return
    last = next((r for r in reversed(records) if r["step"] <= end["step"]), records[0])
    for ax, x in ((axes[0], end["step"]), (axes[1], last["time"] - start)):
        ax.axvline(x, color="tab:gray", linestyle="--", linewidth=1, label=f"stopped: {end['reason']}")


# The signs of entropy collapse: the field, its axis label, its scale and top on that axis, its level.
COLLAPSE_SIGNS = (("entropy", "entropy (nats/token)", 1.0, None, ENTROPY_WARN),
                  ("filtered_share", "filtered (% of groups)", 100.0, 105.0, FILTERED_WARN))


def _entropy(fig: Figure, records: list[dict]) -> None:
    """Entropy of the trained tokens above the share of finished groups an entry filter
    dropped: a collapsing policy shows entropy falling, then the share rising (README,
    "Results: `tandem report`"). Each warning level dashed, its first crossing dotted."""
    axes = fig.subplots(2, 1, sharex=True)
    for ax, (field, label, scale, top, level) in zip(axes, COLLAPSE_SIGNS):
        points = _series(records, field)
        if points:
            ax.plot([s for s, _ in points], [scale * v for _, v in points], color="tab:blue", linewidth=1.2)
        else:
            ax.text(0.5, 0.5, f"no {field} recorded", transform=ax.transAxes, ha="center")
        ax.axhline(scale * level, color="tab:red", linestyle="--", linewidth=1, label="warning level")
        crossing = first_crossing(records, field)
        if crossing is not None:
            ax.axvline(crossing["step"], color="tab:red", linestyle=":", linewidth=1.5,
                       label=f"first crossed: step {crossing['step']}")
        ax.set_ylabel(label, fontsize="small")
        ax.set_ylim(0, top)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="x-small")
    axes[1].set_xlabel("step")
    fig.suptitle("Entropy collapse: entropy, and groups filtered")


def _series(records: list[dict], field: str) -> list[tuple[int, float]]:
    """(step, value) of the records holding a finite `field`."""
    return [(r["step"], r[field]) for r in records
            if isinstance(r.get(field), (int, float)) and math.isfinite(r[field])]


PLOTS: dict[str, Callable[[Figure, list[dict]], None]] = {
    "reward": _reward,
    "entropy": _entropy,
    "learner-busy": _learner_busy,
    "buffer-depth": _buffer_depth,
    "staleness": _staleness,
    "exclusions": _exclusions,
}


def render_plots(records: list[dict], accounting: dict | None = None, evals: list[dict] = ()) -> dict[str, bytes]:
    """PNG bytes of every plot, by name; exclusions and where the run ended from `accounting`
    when given; the eval records (`metrics.jsonl`) beside the reward."""
    plots = dict(PLOTS)
    plots["reward"] = functools.partial(_reward, evals=list(evals), end=run_end(accounting))
    if accounting is not None:  # the same totals as `accounting.json`
        plots["exclusions"] = functools.partial(_exclusions, excluded=accounting["excluded"])
    pngs = {}
    for name, draw in plots.items():
        fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
        draw(fig, records)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        pngs[name] = buffer.getvalue()
    return pngs


def run_end(accounting: dict | None) -> dict | None:
    """How the run ended, as `accounting.json` records it ("stopped": `reason`, `message`,
    `step`, `version`); None for a run still training, or one from before it was recorded."""
    end = (accounting or {}).get("stopped")
    return end if isinstance(end, dict) and "reason" in end else None


def run_end_line(end: dict) -> str:
    """"The run ended (plateau) at step 310, version 310: <its message>"."""
    where = f" at step {end['step']}, version {end['version']}" if "step" in end and "version" in end else ""
    message = f": {end['message']}" if end.get("message") else ""
    return f"The run ended ({end['reason']}){where}{message}"


def collapse_lines(records: list[dict]) -> list[str]:
    """Where entropy and the filtered share first crossed their warning levels, or how near
    they came; nothing of a field the run did not record."""
    return [line for line in (_entropy_line(records), _filtered_line(records)) if line is not None]


def _entropy_line(records: list[dict]) -> str | None:
    if not (points := _series(records, "entropy")):
        return None
    if (crossing := first_crossing(records, "entropy")) is not None:
        return (f"Entropy of the trained tokens first fell below {ENTROPY_WARN:g} nats at step "
                f"{crossing['step']} ({crossing['entropy']:.2g})")
    step, lowest = min(points, key=lambda point: point[1])
    return f"Entropy of the trained tokens stayed at or above {ENTROPY_WARN:g} nats (lowest {lowest:.2g}, step {step})"


def _filtered_line(records: list[dict]) -> str | None:
    if not (points := _series(records, "filtered_share")):
        return None
    if (crossing := first_crossing(records, "filtered_share")) is not None:
        return (f"Filtered share first reached {FILTERED_WARN:.0%} at step {crossing['step']} "
                f"({crossing['filtered_share']:.0%})")
    step, highest = max(points, key=lambda point: point[1])
    return f"Filtered share stayed below {FILTERED_WARN:.0%} (highest {highest:.0%}, step {step})"


def read_run(run_dir: Path) -> tuple[list[dict], list[dict], dict | None]:
    """The run's step records, eval records and `accounting.json` (None if not written yet)."""
    metrics = MetricsLog(RunDir(run_dir).metrics)
    records, evals = metrics.read(), metrics.read_evals()
    if not records:
        raise FileNotFoundError(f"{RunDir(run_dir).metrics}: no metrics recorded")
    accounting_file = RunDir(run_dir).accounting
    accounting = json.loads(accounting_file.read_text()) if accounting_file.exists() else None
    return records, evals, accounting


def write_report(run_dir: Path) -> dict[str, bytes]:
    """Writes `run_dir/report/<plot>.png` and `run_dir/tensorboard/` from the run's metrics;
    returns the PNGs by name."""
    return _write_report(run_dir, *read_run(run_dir))


def _write_report(run_dir: Path, records: list[dict], evals: list[dict], accounting: dict | None) -> dict[str, bytes]:
    pngs = render_plots(records, accounting, evals)
    out = RunDir(run_dir).report
    out.mkdir(exist_ok=True)
    for name, png in pngs.items():
        (out / f"{name}.png").write_bytes(png)
    rewrite_events(RunDir(run_dir).tensorboard, records)
    if evals:
        rewrite_eval_events(RunDir(run_dir).eval_tensorboard, evals)
    return pngs


@task(name="report", cache_policy=NO_CACHE, persist_result=False)
def publish_report(run_dir: Path, *, run_name: str, markdown: str) -> None:
    """Writes the run's report and sends the summary, with the plots, to Prefect (a run that
    stopped before its first step has none)."""
    try:
        plots = write_report(run_dir)
    except FileNotFoundError:
        plots = {}
    record_summary(run_name=run_name, markdown=markdown, plots=plots)


def report_command(run_dir: Path) -> int:
    """`tandem report RUN_DIR`; exit 1 when the run has no metrics yet."""
    try:
        records, evals, accounting = read_run(run_dir)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 1
    for name in _write_report(run_dir, records, evals, accounting):
        print(RunDir(run_dir).report / f"{name}.png")
    if (end := run_end(accounting)) is not None:
        print(run_end_line(end))
    for line in collapse_lines(records):
        print(line)
    best = best_version(read_scores(run_dir))
    if best is not None:
        print(f"Best version by eval score: {best['version']} (step {best['step']}): success "
              f"{best['success_rate']:.0%}, reward {best['reward_mean']:.3f} on {best['prompts']} eval prompts")
    print(f"TensorBoard: tensorboard --logdir {RunDir(run_dir).tensorboard}")
    return 0
