"""An evaluation's results in the run directory, and the best version among them.

  eval/scores.jsonl          one line per evaluation: version, step, its checkpoint, scores
  eval/v{N}.json             the latest evaluation of version N (the asset Prefect records)
  eval/weights/v{N}.safetensors  the weights of an evaluated version that has no checkpoint,
                             kept for the best version and the latest only (`tandem export`)
  episodes/eval/v{N}.jsonl   every episode it played (`tasks.records.episodes`)
  metrics.jsonl              its scores as the eval series (`tasks.records.metrics_log`)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tasks.records.atomic import write_json_atomic
from tasks.records.episodes import write_eval_episodes
from tasks.records.metrics_log import MetricsLog
from tasks.run_dir import RunDir


def result_path(run_dir: Path, version: int) -> Path:
    return RunDir(run_dir).eval / f"v{version}.json"


def scores_path(run_dir: Path) -> Path:
    return RunDir(run_dir).eval / "scores.jsonl"


def weights_path(run_dir: Path, version: int) -> Path:
    return RunDir(run_dir).eval / "weights" / f"v{version}.safetensors"


def record_eval(run_dir: Path, *, version: int, step: int, checkpoint: Path | None, outcome: dict,
                params_bytes: bytes | None = None) -> dict:
    """Writes an evaluation's results (module docstring); returns its scores line.
    `params_bytes`: the weights, kept while the version is the best or the latest."""
    line = {"version": version, "step": step, "checkpoint": str(checkpoint) if checkpoint else None,
            "time": time.time(), **outcome["scores"]}
    write_eval_episodes(run_dir, version, outcome["episodes"])
    RunDir(run_dir).eval.mkdir(exist_ok=True)
    write_json_atomic(result_path(run_dir, version), line)
    with scores_path(run_dir).open("a") as f:
        f.write(json.dumps(line) + "\n")
    MetricsLog(RunDir(run_dir).metrics).append_eval(step=step, version=version, scores=outcome["scores"])
    if params_bytes is not None and checkpoint is None:
        weights_path(run_dir, version).parent.mkdir(parents=True, exist_ok=True)
        weights_path(run_dir, version).write_bytes(params_bytes)
    _prune_weights(run_dir, keep={version, (best_version(read_scores(run_dir)) or {}).get("version")})
    return line


def read_scores(run_dir: Path) -> list[dict]:
    """The latest evaluation of each version, by version."""
    path, latest = scores_path(run_dir), {}
    if path.exists():
        for text in path.read_text(errors="replace").splitlines():
            try:
                line = json.loads(text)
            except json.JSONDecodeError:  # torn by a crash mid-write
                continue
            latest[line["version"]] = line
    return [latest[v] for v in sorted(latest)]


def best_version(scores: list[dict]) -> dict | None:
    """The best evaluated version: highest success rate, then mean reward, then the later."""
    return max(scores, key=lambda s: (s["success_rate"], s["reward_mean"], s["version"]), default=None)


def _prune_weights(run_dir: Path, keep: set) -> None:
    for path in weights_path(run_dir, 0).parent.glob("v*.safetensors"):
        if int(path.stem[1:]) not in keep:
            path.unlink(missing_ok=True)
