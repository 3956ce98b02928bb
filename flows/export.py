"""`tandem export RUN_DIR --version best|N OUT_DIR`: a version's weights as a Hugging Face
directory (safetensors, config, tokenizer) that `transformers` loads, for a model that
came from one (`model.init`)."""

from __future__ import annotations

import sys
from pathlib import Path

from flows.spec import Spec
from learner.hf import save_params
from tasks.eval.results import best_version, read_scores
from tasks.runtime.state.version_weights import version_weights


def resolve_version(run_dir: Path, version: str) -> int:
    """"best": the best evaluated version (`tasks.eval.results.best_version`); else N."""
    if version != "best":
        return int(version)
    best = best_version(read_scores(run_dir))
    if best is None:
        raise ValueError(f"{run_dir}: no version was evaluated; `tandem eval {run_dir}` evaluates them")
    return best["version"]


def export_command(spec: Spec, version: str, out: Path) -> int:
    """`tandem export`: exit 0, or 1 with the reason."""
    try:
        chosen = resolve_version(spec.run_dir.resolve(), version)
        params, step, _ = version_weights(spec, chosen)
        save_params(params, spec.model, out)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"Version {chosen} (step {step}) written to {out} (Hugging Face: transformers "
          f"AutoModelForCausalLM.from_pretrained({str(out)!r}))")
    return 0
