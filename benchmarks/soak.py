"""Soak (not in CI): the default spec trained under random faults, then checked for anything
lost or trained twice.

    python benchmarks/soak.py                        # one hour, a fault every 5 minutes
    python benchmarks/soak.py --minutes 12 --every 2  # a short check

`specs/guess-number.yaml` runs with no success target, no entry filter and more steps than
the time allows, on a Prefect server of its own, its environment `games.stall:Stall`
(guess-number whose step hangs on cue). Every `--every` minutes one of these faults comes,
in a random order that takes each once in every six:
  worker   kill -9 of a Dask worker process of the local cluster (its nanny restarts it);
  learner  kill -9 of the learner process (Prefect retries the learner task, which resumes);
  run      kill -9 of the whole `tandem run` process group, then `tandem resume RUN_DIR`, as
           a user would (so is any `tandem` that exits early: a learner killed a third
           time in one flow run exhausts the task's retries);
  sigterm  SIGTERM to `tandem run` alone (what `timeout` sends): it must exit 143 within
           `SIGTERM_S`, no process of it left, then `tandem resume`;
  server   kill -9 of the local Prefect server that `tandem run` started: the run starts it
           again on its database and trains on (`flows.server.ServerKeeper`);
  hang     one environment call hangs for `HANG_S`, past `env.step_timeout_s`: its group is
           aborted and retried.
When the time is up, the run is stopped the same way as `run` and resumed with
`learner.steps` a few dozen steps past its latest checkpoint, so that it finishes. Then the
figures, from `metrics.jsonl`, `accounting.json` and the latest checkpoint's record:
  steps_twice     step records written twice (records after a checkpoint are replaced on resume)
  trained_twice   prompt ids in the `prompt_ids` of two step records
  prompts_lost    prompts drawn that are nowhere: not trained, not excluded for good, not
                  in flight, buffered or waiting
and whether the accounting balances, the steps run 1..N without a gap, the checkpoint's
record agrees with the metrics, the run finished (exit 0 at `learner.steps`), each SIGTERM
exited 143 in time leaving no process, and no flow run of the soak is left Running.
Logs of each `tandem` go to RUN_DIR.logs/, the server's home too; the figures to
RUN_DIR.logs/soak.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the project's packages

from flows.server import own_server
from flows.spec import load_spec
from tasks.buffer.ledger import balanced
from tasks.records.metrics_log import MetricsLog
from tasks.run_dir import RunDir
from tests.conftest import free_port

TANDEM = str(Path(sys.executable).parent / "tandem")
SPEC = "specs/guess-number.yaml"
FINAL_STEPS = 40  # steps trained after the last resume, at least: the run's end
KINDS = ("worker", "learner", "run", "sigterm", "server", "hang")
SIGTERM_S = 120  # a SIGTERM'd run checkpoints its next version and exits within this
HANG_S = 90  # an environment call's hang: past `env.step_timeout_s` (STEP_TIMEOUT_S)
STEP_TIMEOUT_S = 10


@dataclasses.dataclass
class Soak:
    """The `tandem` process of the run being soaked, and what was done to it."""

    run_dir: Path
    env: dict
    rng: random.Random
    port: int  # the local Prefect server's, which the first `tandem run` starts
    process: subprocess.Popen | None = None
    target: int | None = None  # learner.steps of the last resume: where the run must end
    launches: int = 0
    kills: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    early_exits: list = dataclasses.field(default_factory=list)  # exit codes of runs that ended unasked
    sigterms: list = dataclasses.field(default_factory=list)  # per SIGTERM: exit code, seconds, processes left
    _bag: list = dataclasses.field(default_factory=list)  # kinds left to kill in this round

    @property
    def logs(self) -> Path:
        return self.run_dir.with_suffix(".logs")

    @property
    def cue(self) -> Path:
        """The file whose presence makes the next environment step hang (`games.stall`)."""
        return self.logs / "hang-cue"

    def launch(self, *args: str) -> None:
        self.launches += 1
        with open(self.logs / f"tandem-{self.launches}.log", "w") as log:
            self.process = subprocess.Popen([TANDEM, *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)
        print(f"[{time.strftime('%H:%M:%S')}] tandem {args[0]} (log tandem-{self.launches}.log)", flush=True)

    def resume(self, *overrides: str) -> None:
        self.launch("resume", str(self.run_dir), *(a for o in overrides for a in ("--set", o)))

    def next_kind(self) -> str:
        """The next fault: each kind once per round, in a random order (so that a short
        soak sees them all)."""
        if not self._bag:
            self._bag = self.rng.sample(KINDS, len(KINDS))
        return self._bag.pop()

    def kill(self, kind: str) -> None:
        """Brings a fault of `kind`; a process kind with nothing to kill right now (a learner
        between retries, say) gives way to killing the run."""
        victim = {"worker": self._worker, "learner": self._learner, "server": self._server}.get(kind, lambda: None)()
        if kind in ("worker", "learner", "server") and victim is None:
            kind = "run"
        self.kills[kind] += 1
        print(f"[{time.strftime('%H:%M:%S')}] {kind}" + (f" (pid {victim.pid})" if victim else ""), flush=True)
        if kind == "run":
            self.stop()
            self.resume()
        elif kind == "sigterm":
            self.terminate()
            self.resume()
        elif kind == "server":
            os.killpg(victim.pid, signal.SIGKILL)  # the server leads its own process group
        elif kind == "hang":
            self.cue.touch()
        else:
            victim.kill()

    def terminate(self) -> None:
        """SIGTERM to `tandem run` alone; records its exit code, how long it took, and how
        many of its processes are left a few seconds after it (then killed)."""
        group = [self.process.pid] + [p.pid for p in self._descendants()]
        start = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=SIGTERM_S)
        except subprocess.TimeoutExpired:
            code = None
        seconds = round(time.monotonic() - start, 1)
        time.sleep(5)
        left = [p for p in map(_process, group) if p is not None and p.status() != psutil.STATUS_ZOMBIE]
        self.sigterms.append({"exit_code": code, "seconds": seconds, "processes_left": len(left)})
        print(f"[{time.strftime('%H:%M:%S')}] SIGTERM: exit {code} after {seconds}s, {len(left)} processes left",
              flush=True)
        if code is None or left:
            self.stop()
            for p in left:
                with contextlib.suppress(psutil.Error):
                    p.kill()

    def stop(self) -> None:
        """Kills the `tandem` process group, and waits until none of it is left."""
        group = [self.process.pid] + [p.pid for p in self._descendants()]
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:  # it had ended, and its group with it
            pass
        self.process.wait()
        psutil.wait_procs([p for p in map(_process, group) if p is not None], timeout=30)

    def check_alive(self) -> None:
        """A `tandem` that exited unasked (a learner killed a third time in one flow run
        exhausts the task's retries; or a failure) is resumed, as a user would."""
        if self.process.poll() is not None:
            self.early_exits.append(self.process.returncode)
            print(f"[{time.strftime('%H:%M:%S')}] tandem exited with code {self.process.returncode}: resuming",
                  flush=True)
            self.resume()

    def _server(self) -> psutil.Process | None:
        pid = own_server(self.port)
        return _process(pid) if pid is not None else None

    def _descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def _learner(self) -> psutil.Process | None:
        pid_file = RunDir(self.run_dir).pid()
        text = pid_file.read_text().strip() if pid_file.exists() else ""  # empty while being written
        pid = int(text) if text.isdigit() else None
        return next((p for p in self._descendants() if p.pid == pid), None)

    def _worker(self) -> psutil.Process | None:
        """A Dask worker of the local cluster: a spawned child that is not the learner."""
        learner = self._learner()
        workers = [p for p in self._descendants() if _spawned(p) and (learner is None or p.pid != learner.pid)]
        return self.rng.choice(workers) if workers else None


def _spawned(process: psutil.Process) -> bool:
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return False
    return "multiprocessing" in command and "resource_tracker" not in command


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def soak(state: Soak, minutes: float, every: float) -> None:
    """Trains for `minutes` with a fault every `every` minutes, then brings the run to its end."""
    # No entry filter: the policy reaches 100% success within minutes, after which the
    # zero-variance filter drops nearly every group and the soak would train few steps.
    state.launch("run", SPEC, "--set", "learner.stop_at_success=null", "--set", "learner.plateau_steps=null",
                 "--set", "learner.steps=1000000",
                 "--set", "buffer.filters=[]", "--set", "env.entrypoint=games.stall:Stall",
                 "--set", f"env.kwargs={{values: 12, max_guesses: 4, cue: '{state.cue}', hang_s: {HANG_S}}}",
                 "--set", f"env.step_timeout_s={STEP_TIMEOUT_S}",
                 "--set", "checkpoint.keep=5", "--set", f"checkpoint.dir={state.run_dir}")
    start = time.monotonic()
    kill_at = start + every * 60
    while time.monotonic() < start + minutes * 60:
        state.check_alive()
        if time.monotonic() >= kill_at:
            state.kill(state.next_kind())
            kill_at += every * 60
        time.sleep(1.0)
    state.stop()
    run = RunDir(state.run_dir)
    latest = run.latest_version()
    interval = load_spec(run.spec).sync.interval  # learner.steps must be a multiple of it
    state.target = -(-((run.checkpoint_step(latest) if latest else 0) + FINAL_STEPS) // interval) * interval
    print(f"[{time.strftime('%H:%M:%S')}] time is up: finishing at step {state.target}", flush=True)
    state.resume(f"learner.steps={state.target}")
    state.process.wait(timeout=1800)


def figures(run_dir: Path, state: Soak) -> dict:
    """What the soak proves, from the run directory."""
    run = RunDir(run_dir)
    metrics = MetricsLog(run.metrics).read()
    accounting = json.loads(run.accounting.read_text())
    steps = [m["step"] for m in metrics]
    trained = [i for m in metrics for i in m["prompt_ids"]]
    excluded_for_good = sum(accounting["excluded"].values()) - accounting["retried"]
    placed = (len(set(trained)) + excluded_for_good + accounting["in_flight"] + accounting["buffered"]
              + accounting["waiting"])
    version = run.latest_version()
    record = run.checkpoint_record(version)
    return {
        "steps": len(steps), "steps_twice": len(steps) - len(set(steps)),
        "steps_contiguous": steps == list(range(1, len(steps) + 1)),
        "trained": len(trained), "trained_twice": len(trained) - len(set(trained)),
        "prompts": accounting["prompts"], "prompts_lost": accounting["prompts"] - placed,
        "consumed_matches_metrics": accounting["consumed"] == len(trained),
        "accounting_balanced": balanced(accounting),
        "checkpoint": {"version": version, "step": record["step"],
                       "consumed_matches_metrics": record["accounting"]["consumed"] == len(trained)},
        "finished": state.process.returncode == 0 and steps[-1:] == [state.target] == [record["step"]],
        "exit_code": state.process.returncode, "kills": state.kills, "launches": state.launches,
        "early_exits": state.early_exits, "excluded": accounting["excluded"], "retried": accounting["retried"],
        "learner_sessions_failed_and_retried": _count_in_logs(run_dir, "stopping the actors of learner session"),
        "server_restarts": _count_in_logs(run_dir, "tandem.server - the Prefect server at"),
        "sigterms": state.sigterms, "hangs_taken": len(list(state.logs.glob("hang-cue.taken-*"))),
        "flow_runs": _flow_run_states(state),
    }


def _flow_run_states(state: Soak) -> dict:
    """How many of the soak's flow runs end in each state: none may be left Running."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{state.port}/api"}), \
            get_client(sync_client=True) as client:
        runs = client.read_flow_runs(limit=200)
    counts: dict = {}
    for run in runs:
        name = run.state.name if run.state else "none"
        counts[name] = counts.get(name, 0) + 1
    return counts


def _count_in_logs(run_dir: Path, text: str) -> int:
    return sum(log.read_text(errors="replace").count(text) for log in run_dir.with_suffix(".logs").glob("tandem-*.log"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="training time under kills")
    parser.add_argument("--every", type=float, default=5.0, help="minutes between kills")
    parser.add_argument("--seed", type=int, default=0, help="of the choice of what to kill")
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "soak")
    args = parser.parse_args()
    run_dir = args.run_dir.resolve()
    if run_dir.exists():
        parser.error(f"{run_dir} exists: remove it, or name another with --run-dir")
    run_dir.with_suffix(".logs").mkdir(parents=True, exist_ok=True)
    # The runs' Dask workers import `games.stall` from here, as they would a user's environment module.
    pythonpath = os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")]))
    # The local server of `tandem run`, on a port and in a home of the soak's own (here too,
    # for `own_server`); the code is this checkout's, wherever the `tandem` script was installed from.
    os.environ.update({"TANDEM_PREFECT_PORT": str(free_port()), "TANDEM_HOME": str(run_dir.with_suffix(".logs")),
                       "PREFECT_API_URL": ""})
    state = Soak(run_dir, {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), pythonpath])},
                 random.Random(args.seed), port=int(os.environ["TANDEM_PREFECT_PORT"]))
    try:
        soak(state, args.minutes, args.every)
        result = figures(run_dir, state)
    finally:
        subprocess.run([TANDEM, "server", "stop"], cwd=ROOT, env=state.env, capture_output=True, timeout=120)
    (run_dir.with_suffix(".logs") / "soak.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    sound = (result["finished"] and result["accounting_balanced"] and result["steps_contiguous"]
             and not result["steps_twice"] and not result["trained_twice"] and not result["prompts_lost"]
             and result["consumed_matches_metrics"] and result["checkpoint"]["consumed_matches_metrics"]
             and all(t["exit_code"] == 143 and not t["processes_left"] for t in result["sigterms"])
             and not result["flow_runs"].get("Running"))
    return 0 if sound else 1


if __name__ == "__main__":
    sys.exit(main())
