"""A `tandem run` at an LLM shape, end to end: stopped, resumed and exported.

The model is a `tandem new-model` directory (e.g. qwen2-125m: a byte-level BPE vocabulary
of 32,768 ids and a ChatML template); the environment is the calculator as text, multi-turn
(a tool call, its result, the answer), each turn framed by the chat template. The run is
interrupted as Ctrl-C does (SIGINT) once `--interrupt-at` steps are recorded, resumed with
`tandem resume` to `--steps`, and its latest checkpoint exported with `tandem export`, which
`transformers` loads. Printed: the seconds of each phase, the steps and exit status of each
command, the ledger (groups consumed = steps x batch groups, each once) and the largest
difference between the export's logits and Tandem's. This measures that the path works at
the shape, not learning: every group trains (no filter), whatever its rewards. Usage:

    python benchmarks/llm_run.py --model models/qwen2-125m [--steps 20] [--interrupt-at 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from harness import ROOT, emit
from tasks.buffer.ledger import balanced
from tasks.run_dir import RunDir

TANDEM = str(Path(sys.executable).parent / "tandem")


def overrides(model: Path, run_dir: Path, max_len: int, steps: int) -> list[str]:
    settings = [f"model={{init: {model}, max_len: {max_len}}}", f"learner.buckets=[{max_len}]",
                "learner.rows=8", f"learner.steps={steps}", "learner.batch_groups=2",
                "actors.group_size=4", "actors.groups_per_worker=2", "actors.slots=8",
                "actors.max_new_tokens=8", "buffer.filters=[]", "buffer.capacity=4", "checkpoint.every=4",
                f"eval.every={steps}", f"checkpoint.dir={run_dir}"]
    return [arg for setting in settings for arg in ("--set", setting)]


def steps_recorded(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return 0
    return sum(1 for line in metrics.read_text().splitlines() if '"step"' in line and '"eval"' not in line)


def interrupted_run(command: list[str], run_dir: Path, at: int, log: Path) -> tuple[int, float]:
    """Runs `command`, sends SIGINT once `at` steps are recorded; its exit status and seconds."""
    started = time.time()
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        while process.poll() is None and steps_recorded(run_dir) < at:
            time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        status = process.wait()
    if status != 130:
        raise SystemExit(f"{' '.join(command[:3])} exited {status}, not 130 (interrupted):\n{log.read_text()[-3000:]}")
    return status, time.time() - started


def logits_difference(run_dir: Path, version: int, exported: Path) -> float:
    import torch
    import transformers

    from flows.spec import load_spec
    from learner.model import forward_fn
    from tasks.runtime.state.version_weights import version_weights

    spec = load_spec(run_dir / "spec.yaml")
    params, _, _ = version_weights(spec, version)
    tokens = np.random.default_rng(0).integers(0, spec.model.vocab_size, size=(2, 64))
    ours = jax.jit(forward_fn(spec.model))(params, tokens, np.broadcast_to(np.arange(64), (2, 64)),
                                           np.ones((2, 64), np.int32))
    model = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    with torch.no_grad():
        theirs = model(torch.tensor(tokens)).logits.numpy()
    return float(np.abs(theirs - np.asarray(ours)).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a `tandem new-model` directory")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--interrupt-at", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=192)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "llm_run.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tandem-llm-run-"))
    run_dir, exported = work / "run", work / "exported"
    try:
        settings = overrides(args.model.resolve(), run_dir, args.max_len, args.steps)
        first_exit, first_s = interrupted_run([TANDEM, "run", "specs/calculator.yaml", *settings], run_dir,
                                              args.interrupt_at, work / "first.log")
        stopped_at = steps_recorded(run_dir)
        started = time.time()
        resumed = subprocess.run([TANDEM, "resume", str(run_dir)], cwd=ROOT, capture_output=True, text=True)
        resume_s = time.time() - started
        latest = RunDir(run_dir).latest_version()
        started = time.time()
        export = subprocess.run([TANDEM, "export", str(run_dir), "--version", str(latest), str(exported)], cwd=ROOT,
                                capture_output=True, text=True)
        export_s = time.time() - started
        accounting = json.loads((run_dir / "accounting.json").read_text())
        row = {"model": args.model.name, "first_exit": first_exit, "first_s": round(first_s, 1),
               "steps_at_interrupt": stopped_at, "resume_exit": resumed.returncode, "resume_s": round(resume_s, 1),
               "steps": steps_recorded(run_dir), "consumed_groups": accounting.get("consumed"),
               "expected_groups": args.steps * 2, "ledger_balanced": balanced(accounting), "export_exit": export.returncode, "export_s": round(export_s, 1),
               "latest_checkpoint": latest,
               "max_logit_difference": logits_difference(run_dir, latest, exported) if export.returncode == 0
               else None, "load": round(os.getloadavg()[0], 2)}
        if resumed.returncode or export.returncode:
            print((resumed.stdout + resumed.stderr + export.stdout + export.stderr)[-3000:])
        emit(f"tandem run at {args.model.name}: interrupted, resumed, exported", [row], args.out,
             accounting=accounting)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
