"""`tandem eval RUN_DIR`: evaluates a run's versions after the fact, through the same Prefect
task and Dask code path as evaluations during training (`tasks.eval`), on a cluster of
the run's `actors` section; prints the scores as a table and writes it to
`RUN_DIR/eval/table.md`."""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path

from prefect import flow

from flows.show import transcript
from flows.spec import Spec
from learner.serialization import params_to_bytes
from tasks.actors.cluster import actor_cluster
from tasks.actors.envs import resolve_entrypoint
from tasks.eval.play import EvalSetup
from tasks.eval.prompts import eval_prompts
from tasks.eval.results import best_version, read_scores, scores_path
from tasks.eval.task import EvalCluster, EvalTarget, evaluate_version
from tasks.records.episodes import eval_episodes_path, read_episodes
from tasks.run_dir import RunDir
from tasks.runtime.processes.interrupt import blocking, deferred
from tasks.runtime.state.version_weights import available_versions, version_weights

COLUMNS = ("version", "step", "success_rate", "reward_mean", "length_mean", "turns_mean", "episodes", "aborted",
           "eval_s")


@flow(name="tandem-eval", log_prints=True)
def evaluate_run(spec: Spec, versions: list[int]) -> list[dict]:
    """Evaluates each of `versions` of `spec`'s run; their scores lines."""
    run_dir = spec.run_dir.resolve()
    prompts = eval_prompts(spec.eval, resolve_entrypoint(spec.env.entrypoint), spec.env.kwargs)
    setup = EvalSetup(spec.eval, spec.env, spec.actors, spec.model, tuple(prompts))
    lines = []
    with contextlib.ExitStack() as stack:
        # A Ctrl-C while the cluster starts lands once it can be closed, and never reaches its
        # workers: the terminal signals them too, and a worker closing by itself fails Dask's close.
        with deferred(signal.SIGINT), blocking(signal.SIGINT):
            address = stack.enter_context(actor_cluster(spec.actors))
        cluster = stack.enter_context(contextlib.closing(EvalCluster(address)))
        for version in versions:
            params, step, checkpoint = version_weights(spec, version)
            target = EvalTarget(spec.name, run_dir, version, step, checkpoint)
            lines.append(evaluate_version(setup, cluster, target, params_to_bytes(params)))
    return lines


def table(lines: list[dict]) -> str:
    """The scores as a Markdown table, the best version marked."""
    best = (best_version(lines) or {}).get("version")
    pass_at = sorted({k for line in lines for k in line if k.startswith("pass_at_") and k != "pass_at_1"})
    columns = [*COLUMNS[:4], *pass_at, *COLUMNS[4:]]
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for line in lines:
        cells = [_cell(line.get(c)) for c in columns]
        cells[0] += " (best)" if line["version"] == best else ""
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def eval_summary(run_dir: Path, episodes: int = 2) -> str:
    """Markdown for the run summary: the best version, the eval table, a few of the best
    version's episodes as transcripts and a link to all of them; "" if nothing was evaluated."""
    scores = read_scores(run_dir)
    best = best_version(scores)
    if best is None:
        return ""
    path = eval_episodes_path(run_dir, best["version"])
    shown = "\n\n".join(transcript(r) for r in read_episodes(path)[:episodes]) if path.exists() else ""
    return (f"\n## Evaluation\n\nBest version by eval score: **{best['version']}** "
            f"(step {best['step']}): success {best['success_rate']:.0%}, reward {best['reward_mean']:.3f} over "
            f"{best['episodes']} episodes. `tandem export {run_dir} --version best OUT_DIR` writes it.\n\n"
            f"{table(scores)}\nEpisodes of version {best['version']} ([all of them]({path.as_uri()}); "
            f"`tandem show {run_dir} --eval --version {best['version']}`):\n\n```\n{shown}\n```\n")


def _cell(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else "" if value is None else str(value)


def chosen_versions(run_dir: Path, version: int | None, every: bool) -> list[int]:
    """--all: every version with weights; --version N; else the latest."""
    versions = available_versions(run_dir)
    if every:
        return versions
    if version is not None:
        return [version]
    return versions[-1:]


def eval_command(spec: Spec, version: int | None, *, every: bool, verbose: bool) -> int:
    """`tandem eval`, reporting to the configured Prefect API or a local server: exit 0, or 1
    if there is nothing to evaluate or an evaluation failed."""
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from rich.console import Console

    from flows.console import terminal_logging
    from flows.server import ensure_api, ui_url

    run_dir = spec.run_dir.resolve()
    versions = chosen_versions(run_dir, version, every)
    if not versions:
        print(f"{run_dir}: no checkpoint to evaluate", file=sys.stderr)
        return 1
    try:
        api_url, _ = ensure_api()
    except RuntimeError as e:  # the local Prefect server did not start
        print(e, file=sys.stderr)
        return 1
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"Prefect UI: {ui_url(api_url)}")
    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}), terminal_logging(console, verbose):
            state = evaluate_run(spec, versions, return_state=True)
    except KeyboardInterrupt:  # each version's scores are written as it finishes: nothing to undo
        print(f"Interrupted (Ctrl-C); the versions evaluated before it are in {scores_path(run_dir)}",
              file=sys.stderr)
        return 130
    if not state.is_completed():
        print(f"eval failed: {state.message}", file=sys.stderr)
        return 1
    text = table(read_scores(run_dir))
    table_path = RunDir(run_dir).eval / "table.md"
    table_path.write_text(text)
    print(text, end="")
    print(f"Written to {table_path}; episodes: tandem show {run_dir} --eval --version N")
    return 0
