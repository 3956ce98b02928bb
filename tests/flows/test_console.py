"""What `tandem run` shows and says, without training: the live display, the terminal's
log filter, the notice of a continued run and `--fresh`, the learner's stop on Ctrl-C,
`tandem server` with no server."""

import io
import logging
import re
import signal
import sys

import numpy as np
import pytest
from prefect.logging.loggers import PrefectLogAdapter
from prefect.settings import PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW, temporary_settings
from rich.console import Console

from flows import cli
from flows.cli import main
from flows.console import LiveDisplay, ServerUnreachable, terminal_logging
from flows.server import server_command
from flows.spec import load_spec
from tasks.records.loggers import ROUTINE, Progress
from tasks.runtime.state.checkpoints import Checkpoints
from tasks.runtime.processes.interrupt import Interrupt
from tests.conftest import free_port
from tests.tasks.runtime.session.test_session import session

SPEC = "name: x\nlearner:\n  steps: 8\nsync:\n  interval: 4\ncheckpoint:\n  dir: {run_dir}\n"


def progress(step: int, **fields) -> Progress:
    return Progress(**{"step": step, "version": step // 4, "reward_mean": 0.5, "success_rate": 0.25,
                       "buffered": 96, "learner_busy": 0.9, "loss": 0.1, "entropy": 0.43, "filtered_share": 0.375,
                       **fields})


def test_display_off_a_terminal_prints_a_plain_line_at_most_every_few_seconds():
    out, clock = io.StringIO(), iter([0.0, 1.0, 20.0])
    with LiveDisplay(Console(file=out, width=200), total_steps=100, stop_at_success=0.95, every_s=15,
                     clock=lambda: next(clock)) as display:
        for step in (1, 2, 3):
            display.update(progress(step))
    lines = out.getvalue().splitlines()
    assert lines == [
        "step 1/100 version 0 | success 25% | reward 0.50 | entropy 0.43 | filtered 38% | buffered 96 | busy 90% | ETA -",
        "step 3/100 version 0 | success 25% | reward 0.50 | entropy 0.43 | filtered 38% | buffered 96 | busy 90% | "
        "ETA ≤ 16:10"]


def test_display_marks_entropy_and_the_filtered_share_past_their_warning_levels():
    """Red on a terminal, a `!` everywhere: entropy collapse coming (README, "The two commands")."""
    out = io.StringIO()
    with LiveDisplay(Console(file=out, width=200), total_steps=100, stop_at_success=None) as display:
        display.update(progress(1, entropy=0.05, filtered_share=0.92))
        assert "[bold red]entropy 0.05![/] | [bold red]filtered 92%![/] |" in display.status()
    assert "| entropy 0.05! | filtered 92%! |" in out.getvalue()  # markup rendered, not printed
    display.update(progress(2, entropy=None, filtered_share=None))
    assert "entropy" not in display.status() and "filtered" not in display.status()


def test_display_says_what_a_ctrl_c_does():
    interrupt = Interrupt()
    display = LiveDisplay(Console(file=io.StringIO()), total_steps=100, stop_at_success=None, interrupt=interrupt)
    display.update(progress(5))
    interrupt.request()
    assert display.status().endswith("Ctrl-C: stopping at the next version (Ctrl-C again: at once)")
    interrupt.request()
    assert display.status().endswith("Ctrl-C twice: stopping at once")
    sigterm = Interrupt()
    display = LiveDisplay(Console(file=io.StringIO()), total_steps=100, stop_at_success=None, interrupt=sigterm)
    display.update(progress(5))
    sigterm.request(signal.SIGTERM)  # what Slurm, Kubernetes and `timeout` send
    assert display.status().endswith("SIGTERM: stopping at the next version (Ctrl-C again: at once)")


def test_the_live_line_stays_whole_on_a_terminal_after_a_ctrl_c():
    """At 160 columns the step, the bar and what a Ctrl-C does all show, none cut ("step …")."""
    out = io.StringIO()
    interrupt = Interrupt()
    with LiveDisplay(Console(file=out, width=160, force_terminal=True), total_steps=1000,
                     stop_at_success=0.95, interrupt=interrupt) as display:
        display.update(progress(250))
        interrupt.request()
        display.refresh()
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).replace("\r", "\n").splitlines()
    assert [line for line in shown if line.strip()][-1].startswith("step 250/1000")
    assert [line for line in shown if line.strip()][-1].endswith(
        "version 62 | success 25% | Ctrl-C: stopping at the next version (Ctrl-C again: at once)")


def test_a_failure_reaches_the_terminal_once_without_its_traceback(tmp_path):
    out, log_file = io.StringIO(), tmp_path / "run" / "tandem.log"
    task_run = logging.LoggerAdapter(logging.getLogger("prefect.task_runs"), {"task_run_name": "learner-0"})
    with (temporary_settings(updates={PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW: "ignore"}),  # no flow run here
          terminal_logging(Console(file=out, width=200), verbose=False, log_file=log_file)):
        try:
            raise ValueError("observations outside the alphabet")
        except ValueError:
            task_run.error("Task run failed with exception: ValueError('observations outside the alphabet')",
                           exc_info=True)
            logging.getLogger("tandem").error("the learner failed", exc_info=True)
        task_run.error("Finished in state Failed('Task run encountered an exception ValueError')")
    shown = out.getvalue()
    assert "the learner failed" in shown and "Traceback" not in shown and "Task run failed" not in shown
    assert "Finished in state Failed" not in shown
    logged = log_file.read_text()  # the whole of it, tracebacks included
    assert logged.count("Traceback") == 2 and "Finished in state Failed" in logged


def test_a_server_outage_reaches_the_terminal_as_one_line_and_the_log_file_whole(tmp_path, monkeypatch):
    out, log_file, clock = io.StringIO(), tmp_path / "tandem.log", [0.0]
    monkeypatch.setattr(ServerUnreachable, "__init__",
                        lambda self: logging.Filter.__init__(self) or setattr(self, "quiet_s", 60.0)
                        or setattr(self, "clock", lambda: clock[0]) or setattr(self, "_last", None))
    events, internal = logging.getLogger("prefect.events.clients"), logging.getLogger("prefect._internal.concurrency")
    with (temporary_settings(updates={PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW: "ignore"}),
          terminal_logging(Console(file=out, width=200), verbose=False, log_file=log_file)):
        for second in (0, 7, 14, 21, 200):  # one spell of 21 s, then another
            clock[0] = float(second)
            events.warning("Unable to connect to %r. Reason: %s", "ws://127.0.0.1:1/api/events/in", "refused")
            internal.error("Service %r failed to process item %r", "EventsWorker", "Event(" + "x" * 2000 + ")")
        internal.error("Service %r failed at something else", "Other")
    shown = out.getvalue()
    assert shown.count("the Prefect server does not answer") == 2 and "xxxx" not in shown
    assert "failed at something else" in shown  # other errors pass
    logged = log_file.read_text()
    assert logged.count("Unable to connect") == 5 and logged.count("failed to process item") == 5
    assert logging.getLogger("prefect._internal").propagate is False  # restored


def test_a_plain_handler_left_on_the_root_prints_nothing_twice(monkeypatch):
    """`logging.basicConfig`'s handler (absl installs it when it logs first) is set aside
    while the terminal's handler runs, and put back after."""
    stderr, out = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    plain = logging.StreamHandler()  # on sys.stderr, as basicConfig makes it
    logging.getLogger().addHandler(plain)
    try:
        with (temporary_settings(updates={PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW: "ignore"}),
              terminal_logging(Console(file=out, width=200), verbose=False)):
            logging.getLogger("tandem").warning("said once")
        assert out.getvalue().count("said once") == 1 and "said once" not in stderr.getvalue()
        assert plain in logging.getLogger().handlers
    finally:
        logging.getLogger().removeHandler(plain)


@pytest.mark.parametrize("verbose", [False, True])
def test_terminal_shows_what_is_not_routine_unless_verbose(verbose):
    out, task_run = io.StringIO(), PrefectLogAdapter(logging.getLogger("prefect.task_runs"),
                                                     {"task_run_name": "learner-0"})
    dask_level = logging.getLogger("distributed").level
    with (temporary_settings(updates={PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW: "ignore"}),  # no flow run here
          terminal_logging(Console(file=out, width=200), verbose=verbose)):
        logging.getLogger("distributed.scheduler").info("Register worker addr: tcp://127.0.0.1:1")
        task_run.info("Finished in state Completed()")
        task_run.info(progress(7).line(), extra=ROUTINE)  # as the learner task relays it
        task_run.info("eval of version 3: success 50%", extra=ROUTINE)
        task_run.info("resumed from /r/checkpoints/2: step 8, version 2")
        logging.getLogger("distributed.worker").warning("a worker's warning")
    shown = out.getvalue()
    assert "Task run 'learner-0' - resumed from" in shown and "a worker's warning" in shown
    for routine in ("Register worker", "Completed()", "step 7 version 1 |", "eval of version 3"):
        assert (routine in shown) == verbose, routine
    assert logging.getLogger("distributed").level == dask_level  # restored


@pytest.fixture
def no_training(monkeypatch):
    started = []
    monkeypatch.setattr(cli, "_run", lambda spec: started.append(spec) or 0)
    return started


def a_run(tmp_path, version=3, step=10):
    """A run directory with its spec and a checkpoint of `version` at `step` (not version ×
    sync.interval: a resume changed the interval, say)."""
    run_dir = tmp_path / "run"
    checkpoints = Checkpoints(run_dir / "checkpoints", keep=None)
    checkpoints.save(version, {"w": np.zeros(2, np.float32)}, {"step": step, "version": version})
    checkpoints.close()
    (run_dir / "checkpoints" / f"{version + 1}.orbax-checkpoint-tmp-12").mkdir()  # not a checkpoint
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(run_dir=run_dir))
    (run_dir / "spec.yaml").write_text(load_spec(spec).to_yaml())
    return str(spec), run_dir


def test_run_says_it_continues_a_run_and_how_to_start_anew(tmp_path, capsys, no_training):
    spec, run_dir = a_run(tmp_path)
    assert main(["run", spec]) == 0
    out = capsys.readouterr().out
    assert "holds a run (checkpoint of version 3, step 10): continuing it" in out and "--fresh" in out
    assert run_dir.exists() and no_training


def test_run_refuses_another_spec_on_an_existing_run_and_says_the_ways_on(tmp_path, capsys, no_training):
    spec, run_dir = a_run(tmp_path)
    before = (run_dir / "spec.yaml").read_text()
    assert main(["run", spec, "--set", "learner.steps=12"]) == 2
    err = capsys.readouterr().err
    assert "learner.steps: 8 -> 12" in err and "--fresh" in err
    assert f"resume {run_dir} --set learner.steps=12" in err
    assert (run_dir / "spec.yaml").read_text() == before and not no_training


def test_resume_refuses_a_change_the_checkpoints_depend_on_before_anything_changes(tmp_path, capsys, no_training):
    _, run_dir = a_run(tmp_path)
    before = (run_dir / "spec.yaml").read_text()
    assert main(["resume", str(run_dir), "--set", "model.d_model=128", "--set", "learner.steps=20"]) == 2
    err = capsys.readouterr().err
    assert "model.d_model: 64 -> 128" in err and "learner.steps" not in err  # steps may change on resume
    assert (run_dir / "spec.yaml").read_text() == before and not no_training


def test_resume_takes_a_change_of_steps(tmp_path, capsys, no_training):
    _, run_dir = a_run(tmp_path)
    assert main(["resume", str(run_dir), "--set", "learner.steps=20"]) == 0
    assert no_training[0].learner.steps == 20


def test_fresh_moves_the_previous_run_aside(tmp_path, capsys, no_training):
    spec, run_dir = a_run(tmp_path)
    (tmp_path / "run.1").mkdir()
    assert main(["run", spec, "--fresh"]) == 0
    assert not run_dir.exists() and (tmp_path / "run.2" / "checkpoints" / "3").is_dir()
    assert "the previous run is now" in capsys.readouterr().out and no_training


def test_resume_says_from_where(tmp_path, capsys, no_training):
    _, run_dir = a_run(tmp_path)
    assert main(["resume", str(run_dir)]) == 0
    assert "from its checkpoint of version 3 (step 10)" in capsys.readouterr().out


@pytest.mark.parametrize("action, code", [("status", 1), ("stop", 0)])
def test_server_commands_without_a_server(capsys, action, code):
    port = free_port()
    assert server_command(action, port) == code
    assert capsys.readouterr().out == f"no Prefect server at http://127.0.0.1:{port}\n"


def test_interrupted_session_trains_to_its_next_version_and_checkpoints_it(tmp_path):
    run, recorder = session(tmp_path, steps=40, interval=4)
    run.interrupted = lambda: bool(recorder.steps) and recorder.steps[0][0] >= 1  # from the first step on
    result = run.run()
    assert (result["step"], result["version"], result["stopped"]) == (4, 1, "interrupted")
    assert Checkpoints(tmp_path / "checkpoints", None).versions() == [1] and recorder.versions == [1]


def test_session_interrupted_before_it_trains_stops_without_a_step(tmp_path):
    run, recorder = session(tmp_path, steps=40, interval=4)
    run.interrupted = lambda: True
    result = run.run()
    assert (result["step"], result["stopped"]) == (0, "interrupted") and recorder.steps == []
