"""What the learner task records besides relaying the learner's events: the run's
versions table and lineage (`tasks.records.artifacts`), and the evaluations of versions
(`tasks.eval`) run beside training."""

from __future__ import annotations

import time

from tasks.actors.envs import resolve_entrypoint
from tasks.eval.play import EvalSetup
from tasks.eval.prompts import eval_prompts
from tasks.eval.results import read_scores
from tasks.eval.runner import Evaluations
from tasks.records.artifacts import record_version, record_versions_table, run_key
from tasks.records.loggers import ROUTINE
from tasks.records.versions import VersionTable
from tasks.run_dir import RunDir


class TaskRecords:
    """The versions table, kept from version events and evaluations; the evaluations."""

    last_wait_s = 300.0  # once training is over, for the evaluations still running
    table_every_s = 10.0  # the table's eval scores are sent at most this often (and at the end)

    def __init__(self, spec, scheduler_address: str, log):
        """`spec`: a `tasks.runtime.session.build.RunSpec`; `log` has .info and .warning."""
        run_dir = spec.run_dir.resolve()
        self.spec, self.log, self.checkpoints = spec, log, RunDir(run_dir).checkpoints
        self.artifact_key = run_key(spec.name, _flow_run_name())  # this run's artifacts, no other's
        # The run's table as its latest checkpoint holds it (none for a new run), with its
        # scores; each version committed from now on adds its row (`version`).
        self.table = VersionTable(RunDir(run_dir).versions_table(), read_scores(run_dir))
        self._scored, self._sent = False, time.monotonic()  # scores not yet in the table sent; when last sent
        self.evals = None
        if spec.eval.every is not None:
            prompts = eval_prompts(spec.eval, resolve_entrypoint(spec.env.entrypoint), spec.env.kwargs)
            setup = EvalSetup(spec.eval, spec.env, spec.actors, spec.model, tuple(prompts))
            self.evals = Evaluations(setup, scheduler_address, run_name=spec.name, run_dir=run_dir, log=log,
                                     concurrency=spec.actors.workers)

    def version(self, payload: dict) -> None:
        self.table.add_rows([payload.pop("row")])
        record_version(**payload, rows=self.table.rows(), key=self.artifact_key)
        self._scored, self._sent = False, time.monotonic()

    def evaluate(self, payload: dict) -> None:
        checkpoint = self.checkpoints / str(payload["version"]) if payload["checkpointed"] else None
        self.evals.submit(version=payload["version"], step=payload["step"], params=payload["params"],
                          checkpoint=checkpoint)

    def collect(self, wait_s: float | None = 0.0) -> None:
        """Records the evaluations that finished (waiting up to `wait_s` for the rest). The
        table goes to Prefect at most every `table_every_s`, and on a final collect
        (`wait_s` not 0): each sending costs the server ~30 ms, and an evaluation every 5
        steps would send it a few times a second."""
        lines = self.evals.finished(wait_s) if self.evals is not None else []
        for line in lines:
            self.log.info(f"eval of version {line['version']}: success {line['success_rate']:.0%}, "
                          f"reward {line['reward_mean']:.3f} over {line['episodes']} episodes "
                          f"({line['eval_s']:.1f} s)", extra=ROUTINE)  # the run's end names the best
            self.table.add_eval(line)
        self._scored = self._scored or bool(lines)
        if self._scored and (wait_s != 0.0 or time.monotonic() - self._sent >= self.table_every_s):
            self._send_table()

    def _send_table(self) -> None:
        record_versions_table(run_name=self.spec.name, rows=self.table.rows(), key=self.artifact_key)
        self._scored, self._sent = False, time.monotonic()

    def close(self) -> None:
        if self.evals is not None:
            self.evals.close()
        if self._scored:  # the scores since the last sending (an interrupted run's, say)
            try:
                self._send_table()
            except Exception as e:  # closing after a failure: that failure is the one to raise
                self.log.warning(f"the versions table's latest scores were not sent: {type(e).__name__}: {e}")


def _flow_run_name() -> str | None:
    """The Prefect flow run this task runs in, None outside one (a test)."""
    from prefect.runtime import flow_run

    return flow_run.get_name()
