"""The evaluations of a training run, beside its learner task: each version the learner
hands over becomes an `eval-v{N}` task run in a thread of its own (Prefect's context
copied into it), so neither the learner nor the task relaying its events waits for one.
The relay collects those that finished, for the run's versions table (`tasks.records.versions`).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
from pathlib import Path
from typing import Any

from tensorboardX import SummaryWriter

from learner.serialization import params_to_bytes
from tasks.eval.play import EvalSetup
from tasks.eval.task import EvalCluster, EvalTarget, evaluate_version
from tasks.records.tensorboard import add_eval
from tasks.run_dir import RunDir


class Evaluations:
    """Submits evaluations (`submit`), hands back the scores of those finished (`finished`)."""

    def __init__(self, setup: EvalSetup, scheduler_address: str, *, run_name: str, run_dir: Path, log,
                 concurrency: int = 1):
        self.setup, self.run_name, self.run_dir, self.log = setup, run_name, run_dir, log
        self.cluster = EvalCluster(scheduler_address)
        # One at a time per actor process: each has one thread beside its actor task.
        self._pool = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="tandem-eval")
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._tensorboard: SummaryWriter | None = None

    def submit(self, *, version: int, step: int, params: Any, checkpoint: Path | None) -> None:
        """Starts evaluating `params` (host NumPy) as version `version`."""
        target = EvalTarget(self.run_name, self.run_dir, version, step, checkpoint)
        context = contextvars.copy_context()  # this task run's: the eval's run is its child
        self._pending[version] = self._pool.submit(context.run, self._evaluate, target, params)

    def _evaluate(self, target: EvalTarget, params: Any) -> dict:
        return evaluate_version(self.setup, self.cluster, target, params_to_bytes(params))

    def finished(self, wait_s: float | None = 0.0) -> list[dict]:
        """The scores lines of the evaluations done (waiting up to `wait_s` for all; None:
        as long as they take). One that failed every retry is logged and dropped."""
        done, _ = concurrent.futures.wait(self._pending.values(), timeout=wait_s)
        lines = []
        for version, future in sorted(self._pending.items()):
            if future not in done:
                continue
            del self._pending[version]
            try:
                lines.append(future.result())
            except Exception as e:  # whatever failed, training goes on
                self.log.warning(f"the eval of version {version} failed, training goes on: {type(e).__name__}: {e}")
        for line in lines:
            if self._tensorboard is None:  # a run of its own beside training's (`eval/...` series)
                self._tensorboard = SummaryWriter(str(RunDir(self.run_dir).eval_tensorboard))
            scores = {k: v for k, v in line.items() if k not in ("version", "step", "time", "checkpoint")}
            add_eval(self._tensorboard, {"step": line["step"], "time": line["time"], "eval": scores})
        return lines

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.cluster.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
