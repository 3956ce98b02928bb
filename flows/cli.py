"""`tandem`: validate, run and resume experiment specs; evaluate, report on, show and export
runs; the local Prefect server.

Exit codes: 0 success (the step or success target), 1 the run failed, 2 a bad spec: one
that does not validate, or that cannot run from here (an environment, filter or cluster
class that does not import, a data file that does not read), found before anything
starts, or a change to a run's spec that `flows.spec_changes` refuses; 3 the run ended by itself short of its target (a plateau, or no learning signal:
checkpointed, resumable with other settings); 130 interrupted (Ctrl-C: the run stopped on
a checkpoint, and `tandem resume RUN_DIR` continues it); 143 terminated (SIGTERM, as Slurm,
Kubernetes and `timeout` send it: stopped as by a Ctrl-C). A SIGKILL leaves no process of
the run behind for long (`tasks.runtime.processes.task`); `tandem resume RUN_DIR` continues it too.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from flows.spec import Spec, SpecError, SpecIssue, load_spec
from tasks.run_dir import RunDir

BAD_SPEC = 2
SHORT_OF_TARGET = 3  # a plateau or no learning signal (`tasks.runtime.session.stopping`)
_verbose = False  # `--verbose`: the terminal shows Prefect's and Dask's INFO logs too
# Where `tandem run` is, for its signal handler (`_on_signal`): "server" (waiting for a Prefect
# server), "starting" (importing, say), "training" (Ctrl-C or SIGTERM stops the learner on a checkpoint).
_stage = "starting"


def main(argv: list[str] | None = None) -> int:
    """The `tandem` command (`argv` None: the command line), or its `argv` (tests)."""
    global _exit_code
    if argv is None:  # the console script, which exits with the code next: see `_exit_at_once`
        atexit.register(_exit_at_once)  # before anything imports Prefect (this module does not)
    code = _main(argv)
    if argv is None:
        _exit_code = code
    return code


_exit_code: int | None = None


def _exit_at_once() -> None:
    """Registered before Prefect registers its handlers (which send the last logs and
    events), so it runs after them: the `tandem` command then leaves without the
    interpreter's teardown of JAX's and Prefect's objects, a second or two."""
    if _exit_code is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_code)


def _main(argv: list[str] | None) -> int:
    global _verbose
    args = _parser().parse_args(argv)
    if (code := _on_a_run_dir(args)) is not None:
        return code
    try:
        spec = _spec(args)
    except SpecError as e:
        print(e, file=sys.stderr)
        return BAD_SPEC
    if args.command == "validate":
        print(f"{args.spec}: ok ({spec.name}, run directory {spec.run_dir})")
        return 0
    if (code := _on_a_spec(args, spec)) is not None:
        return code
    _verbose = args.verbose
    if args.command == "resume":
        if (code := _resumable(args, spec)) is not None:
            return code
        if (version := RunDir(spec.run_dir).latest_version()) is not None:
            print(f"Resuming {shown(spec.run_dir)} from its checkpoint of version {version} "
                  f"(step {RunDir(spec.run_dir).checkpoint_step(version)})")
    if args.command == "run" and (code := _new_or_continued(spec, fresh=args.fresh)) is not None:
        return code
    return _run(spec)


def _on_a_run_dir(args) -> int | None:
    """The commands that need no spec (report, server, show, new-model); None for the others."""
    if args.command == "report":
        from flows.report import report_command

        return report_command(args.run_dir)
    if args.command == "server":
        from flows.server import server_command

        return server_command(args.action, args.port)
    if args.command == "show":
        from flows.show import show_command

        return show_command(args.run_dir, version=args.version, failed=args.failed, evals=args.eval, limit=args.limit)
    if args.command == "new-model":
        from flows.new_model import new_model_command

        return new_model_command(args.shape, args.out_dir, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
                                 seed=args.seed, max_len=args.max_len, copy_steps=args.copy_steps)
    return None


def _on_a_spec(args, spec: Spec) -> int | None:
    """The commands that read a spec but do not train (eval, export, audit); None for the others."""
    if args.command == "eval":
        from flows.evaluate import eval_command

        return eval_command(spec, args.version, every=args.all, verbose=args.verbose)
    if args.command == "export":
        from flows.export import export_command

        return export_command(spec, args.version, args.out_dir)
    if args.command == "audit":
        from flows.audit import audit_command

        return audit_command(spec, mode=args.mode, groups=args.groups, train_steps=args.train_steps,
                             env_steps=args.env_steps, json_path=args.json)
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    validate = commands.add_parser("validate", help=("check a spec, and that its modules import and its data "
                                                     "file reads; print every error with its field and line"))
    run = commands.add_parser("run", help="run a spec (continues the run in its run directory, if any)")
    run.add_argument("--fresh", action="store_true",
                     help="start anew: a previous run in the run directory is moved to RUN_DIR.N")
    for command in (validate, run):
        command.add_argument("spec", type=Path)
        command.add_argument("--set", dest="overrides", action="append", default=[],
                             metavar="PATH=VALUE", help="override a field; VALUE is parsed as YAML")
    resume = commands.add_parser("resume", help="continue a run from its latest checkpoint")
    resume.add_argument("run_dir", type=Path)
    resume.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                        help="override a field of the run's spec (e.g. learner.steps=400 to extend it)")
    for command in (run, resume):
        command.add_argument("--verbose", action="store_true",
                             help=("show every INFO log of Prefect and Dask (default: warnings, and the few "
                                   "that matter: a resume, a retry, why it stopped)"))
    _audit_parser(commands)
    _run_dir_parsers(commands)
    report = commands.add_parser("report", help="plot a run's metrics into RUN_DIR/report/ and RUN_DIR/tensorboard/")
    report.add_argument("run_dir", type=Path)
    _new_model_parser(commands)
    server = commands.add_parser("server", help="the local Prefect server runs use (it outlives them)")
    server.add_argument("action", choices=("start", "stop", "status"))
    server.add_argument("--port", type=int, default=None,
                        help="default: $TANDEM_PREFECT_PORT, else 4200")
    return parser


def _run_dir_parsers(commands) -> None:
    """The commands on a run's directory: eval, show, export."""
    evaluate = commands.add_parser("eval", help="evaluate a run's checkpoints on the eval prompts (the latest by default)")
    evaluate.add_argument("run_dir", type=Path)
    which = evaluate.add_mutually_exclusive_group()
    which.add_argument("--version", type=int, default=None, help="the version to evaluate")
    which.add_argument("--all", action="store_true", help="every version with a checkpoint or kept weights")
    evaluate.add_argument("--set", dest="overrides", action="append", default=[], metavar="eval.FIELD=VALUE",
                          help="override a field of the run's eval section (e.g. eval.n=64)")
    evaluate.add_argument("--verbose", action="store_true", help="show every INFO log of Prefect and Dask")
    show = commands.add_parser("show", help="print a run's episodes as readable transcripts")
    show.add_argument("run_dir", type=Path)
    show.add_argument("--version", type=int, default=None, help="default: the latest with episodes")
    show.add_argument("--failed", action="store_true", help="only episodes that failed or were excluded")
    show.add_argument("--eval", action="store_true", help="the evaluation's episodes, not training's sample")
    show.add_argument("--limit", type=int, default=5, help="episodes to print (default 5)")
    export = commands.add_parser("export", help="write a version as a Hugging Face directory (model.init from one)")
    export.add_argument("run_dir", type=Path)
    export.add_argument("--version", default="best", help="N, or best: the best by eval score (default)")
    export.add_argument("out_dir", type=Path)


def _new_model_parser(commands) -> None:
    from learner.shapes import SHAPES

    new = commands.add_parser("new-model", help="write a randomly initialised model of LLM shape, with a BPE "
                                                "tokenizer and chat template, as a Hugging Face directory")
    new.add_argument("shape", choices=sorted(SHAPES))
    new.add_argument("out_dir", type=Path)
    new.add_argument("--tokenizer", type=Path, default=None,
                     help="a directory holding tokenizer.json and tokenizer_config.json (default: train one)")
    new.add_argument("--vocab-size", type=int, default=32_768, help="ids of the tokenizer trained (default 32768)")
    new.add_argument("--seed", type=int, default=0)
    new.add_argument("--max-len", type=int, default=4_096, help="max_position_embeddings (default 4096)")
    new.add_argument("--copy-steps", type=int, default=0,
                     help="updates of copy pretraining (learner.copying), so that the model can copy from its "
                          "context as a pretrained one can (default 0: random weights; ~600 at qwen2-25m, ~9 min)")


def _audit_parser(commands) -> None:
    audit = commands.add_parser("audit", help="measure env, actors and learner here; recommend the pool and pace")
    audit.add_argument("spec", type=Path)
    audit.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                       help="override a field; VALUE is parsed as YAML")
    audit.add_argument("--mode", choices=("async", "sync"), default=None,
                       help="the learner.mode to recommend settings for (default: the spec's)")
    audit.add_argument("--groups", type=int, default=8, help="groups to play and time")
    audit.add_argument("--train-steps", type=int, default=5, help="learner steps to time")
    audit.add_argument("--env-steps", type=int, default=200, help="environment steps to time")
    audit.add_argument("--json", type=Path, default=None, help="also write the audit here ('-': to stdout)")


def _spec(args: argparse.Namespace) -> Spec:
    if args.command in ("eval", "export"):
        outside = [o for o in getattr(args, "overrides", []) if not o.startswith("eval.")]
        if outside:
            raise SpecError("--set", [SpecIssue(o.partition("=")[0], None, "tandem eval sets only eval.* fields")
                                      for o in outside])
        return load_spec(RunDir(args.run_dir).spec,
                         [*getattr(args, "overrides", []), f"checkpoint.dir={args.run_dir.resolve()}"])
    if args.command == "resume":
        # The run directory is where the spec was found, wherever the run was started from.
        return load_spec(RunDir(args.run_dir).spec,
                         [*args.overrides, f"checkpoint.dir={args.run_dir.resolve()}"])
    return load_spec(args.spec, args.overrides)


def _new_or_continued(spec: Spec, fresh: bool) -> int | None:
    """`tandem run` on a run directory in use: continues that run if `spec` is its spec, or
    (`fresh`) moves that run aside; else the exit code of a refusal (a running learner's
    directory, or another spec: a run's spec changes only with intent, `flows.spec_changes`)."""
    run_dir, version = spec.run_dir, RunDir(spec.run_dir).latest_version()
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return None
    from tasks.runtime.processes.task import run_dir_locked

    if run_dir_locked(run_dir):
        print(f"{shown(run_dir)} is in use by a running learner", file=sys.stderr)
        return 1
    if fresh:
        aside = next(p for n in range(1, 10_000) if not (p := run_dir.with_name(f"{run_dir.name}.{n}")).exists())
        run_dir.rename(aside)
        print(f"Starting anew; the previous run is now {shown(aside)}")
        return None
    if RunDir(run_dir).spec.is_file():
        from flows.spec_changes import changes_from, described, yaml_value

        changes = changes_from(RunDir(run_dir).spec.read_text(), spec.to_yaml())
        if changes:
            print(f"{shown(run_dir)} holds a run of another spec; its spec is not changed by `tandem run`:\n"
                  f"{described(changes)}\n"
                  f"Either start anew there: add --fresh (the old run is kept as {shown(run_dir)}.N); or continue "
                  f"that run with the changes a resume may take: {tandem_command()} resume {shown(run_dir)} "
                  + " ".join("--set " + shlex.quote(f"{path}={yaml_value(b)}") for path, _, b in changes),
                  file=sys.stderr)
            return BAD_SPEC
    if version is not None:
        print(f"{shown(run_dir)} holds a run (checkpoint of version {version}, step "
              f"{RunDir(run_dir).checkpoint_step(version)}): continuing it. To start anew: add --fresh "
              f"(the old run is kept as {shown(run_dir)}.N)")
    return None


def _resumable(args, spec: Spec) -> int | None:
    """None if `tandem resume`'s overrides leave what the run's checkpoints and ledger
    depend on as it is; else says which fields they change, and the exit code."""
    if not args.overrides:
        return None
    from flows.spec_changes import changes_from, described, fixed

    run_dir = args.run_dir
    refused = fixed(changes_from(RunDir(run_dir).spec.read_text(), spec.to_yaml()))
    if not refused:
        return None
    print(f"{shown(run_dir)}: a resumed run keeps what its checkpoints and ledger were made with; refused:\n"
          f"{described(refused)}\nTrain such a spec as a new run (tandem run SPEC --fresh, or another checkpoint.dir).",
          file=sys.stderr)
    return BAD_SPEC


def _run(spec: Spec) -> int:
    """Trains `spec` through the flow, with a live display. A first Ctrl-C, or SIGTERM, ends
    training on its next version (checkpointed) and exits 130 (143); a second Ctrl-C stops
    it at once (`tasks.runtime.processes.interrupt`)."""
    from tasks.runtime.processes.interrupt import INTERRUPT

    try:
        return _run_and_say(spec)
    finally:
        INTERRUPT.clear()


def _run_and_say(spec: Spec) -> int:
    """`_run`, which clears the stop requests after it."""
    global _stage
    from rich.console import Console

    from tasks.runtime.processes.interrupt import handling, signal_name

    console, started = Console(highlight=False, soft_wrap=True), time.monotonic()
    if not console.is_terminal:  # a pipe, a CI log: long lines rather than wrapped ones
        console.width = 200
    try:
        with handling(_on_signal):
            state, last = _train(spec, console)
    except _Signalled as e:  # before the flow started: nothing to stop
        console.print(f"Interrupted ({signal_name(e.signum)}) before training started.")
        return 128 + e.signum
    except RuntimeError as e:  # the local Prefect server did not start
        print(e, file=sys.stderr)
        return 1
    finally:
        _stage = "starting"
    return _outcome(console, spec, state, last, time.monotonic() - started)


class _Signalled(KeyboardInterrupt):
    """Ctrl-C or SIGTERM before the flow started, which leaves at once."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame) -> None:
    """Counts a stop (`INTERRUPT`), which the flow acts on; leaves at once while a Prefect
    server starts. Elsewhere before the flow `_train` looks, once it can: Python runs a
    handler between any two bytecodes, where the exception can abort the interpreter (in a
    C extension's import: JAX's) or be printed and dropped (in a garbage collector's callback)."""
    from tasks.runtime.processes.interrupt import INTERRUPT

    INTERRUPT.request(signum)
    if _stage == "server":
        raise _Signalled(signum)


def _train(spec: Spec, console):
    """Runs the flow, reporting to the configured Prefect API or a local server; its state,
    and the last step the live display showed (a `Progress`, None if none)."""
    global _stage
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.server import ensure_api, ui_url
    from tasks.runtime.processes.interrupt import INTERRUPT

    _stage = "server"
    try:
        api_url, origin = ensure_api()
    finally:
        _stage = "starting"
    stop = f"{tandem_command()} server stop"
    note = {"started": f" (a local server, started now; it keeps running after the run: `{stop}` stops it)",
            "running": f" (the local server, already running; `{stop}` stops it)"}.get(origin, "")
    console.print(f"Prefect UI: {ui_url(api_url)}{note}")
    from flows.console import LiveDisplay, terminal_logging
    from flows.server import ServerKeeper, local_port
    from flows.train import train
    from tasks.records.loggers import PROGRESS_FEED

    # The local server this project runs is started again if it dies mid-run (`ServerKeeper`).
    keeper = (ServerKeeper(local_port(), logging.getLogger("tandem.server").warning)
              if origin in ("started", "running") else contextlib.nullcontext())
    with (temporary_settings(updates={PREFECT_API_URL: api_url}),
          terminal_logging(console, _verbose, log_file=RunDir(spec.run_dir).log), keeper,
          LiveDisplay(console, spec.learner.steps, spec.learner.stop_at_success) as display,
          PROGRESS_FEED.subscribed(display.update)):
        _stage = "training"
        if INTERRUPT.is_set():  # a signal before the flow (`_on_signal`)
            raise _Signalled(INTERRUPT.signum)
        return train(spec, return_state=True), display.last


def _outcome(console, spec: Spec, state, last, seconds: float) -> int:
    """Says how the run ended and what to do next; the exit code."""
    from tasks.runtime.processes.interrupt import INTERRUPT

    if INTERRUPT.is_set() or state.is_cancelled():  # Cancelled alone: the learner process had a SIGTERM
        return _interrupted(console, spec, last, seconds, INTERRUPT.signum or signal.SIGTERM)
    if not state.is_completed():
        print(f"run failed: {failure(state)}\n(the whole log, tracebacks included: {shown(RunDir(spec.run_dir).log)})",
              file=sys.stderr)
        return 1
    from flows.train import ended

    result = state.result()
    run_dir = shown(spec.run_dir)
    console.print(f"{ended(result)} after {_minutes(seconds)}. Run directory: {run_dir}")
    from tasks.eval.results import best_version, read_scores

    if (best := best_version(read_scores(spec.run_dir))) is not None:
        console.print(f"Best version by eval score: {best['version']} (success {best['success_rate']:.0%} on "
                      f"{'held-out' if spec.eval.held_out else 'eval'} prompts); episodes: {tandem_command()} show {run_dir} --eval --version {best['version']}")
    console.print(f"Plots: {tandem_command()} report {run_dir}")
    from tasks.runtime.session.stopping import StopReason

    return 0 if StopReason(result["stopped"]).reached_target else SHORT_OF_TARGET


def _interrupted(console, spec: Spec, last, seconds: float, signum: int) -> int:
    """Says where an interrupted run stopped and how to resume it; 128 + `signum`, as a
    shell reports a process that `signum` ended (130 for Ctrl-C, 143 for SIGTERM)."""
    from tasks.runtime.processes.interrupt import signal_name

    version = RunDir(spec.run_dir).latest_version()
    step = RunDir(spec.run_dir).checkpoint_step(version) if version is not None else 0
    where = f"its checkpoint of version {version} (step {step})" if version is not None else "the start"
    if version is None and spec.warmup is not None:
        from tasks.run_dir import committed_versions

        updates = committed_versions(RunDir(spec.run_dir).warmup_checkpoints)
        where = f"its warm-up's checkpoint of update {updates[-1]}" if updates else "the start of its warm-up"
    again = f"; steps {step + 1}-{last.step} are trained again" if last and last.step > step else ""
    console.print(f"Interrupted ({signal_name(signum)}) after {_minutes(seconds)}; "
                  f"the run resumes from {where}{again}.")
    console.print(f"Resume with: {tandem_command()} resume {shown(spec.run_dir)}")
    return 128 + signum


FAILURE_CHARS = 600  # the terminal's account of a failure: a few lines, the log file has the rest


def failure(state) -> str:
    """Why a flow run failed, in a few lines: the message of the exception that failed it,
    not Prefect's wrapping of it (its type and the task's name), and of that exception's
    own cause where it only wraps one ("learner failed: Unrecoverable: ...")."""
    from tasks.runtime.session.failures import LearnerFailed

    error = state.result(raise_on_failure=False)
    message = str(error) if isinstance(error, BaseException) and str(error) else str(state.message)
    if isinstance(error, LearnerFailed):
        message = error.message
    return message if len(message) <= FAILURE_CHARS else message[: FAILURE_CHARS - 1] + "…"


def tandem_command() -> str:
    """This command as the user can type it again: `.venv/bin/tandem` from the checkout."""
    path = Path(sys.argv[0])
    return shown(path) if path.name == "tandem" and path.exists() else "tandem"


def shown(path: Path) -> str:
    """`path` relative to the working directory when inside it, else absolute."""
    path = path.resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


if __name__ == "__main__":
    sys.exit(main())
