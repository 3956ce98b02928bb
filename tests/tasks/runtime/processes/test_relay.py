"""The learner's events to its task, with a real spawned process: a learner killed in the
middle of a message is seen dead (the task fails into Prefect's retry) instead of waited
for; the versions table is kept by the task (`tasks.runtime.processes.task_records`), each event
bringing only new rows."""

import logging
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from tasks.config import EvalConfig
from tasks.runtime.processes import task as task_module
from tasks.runtime.processes import task_records
from tasks.runtime.processes.hosts import LearnerProcesses
from tasks.runtime.processes.interrupt import INTERRUPT
from tasks.runtime.processes.relay import EventReader, LogForwarder

SPEC = SimpleNamespace(name="t", learner=SimpleNamespace(steps=8), run_dir=Path("/nonexistent/run"),
                       eval=EvalConfig())


def records():
    """The task's records of a run that evaluates nothing."""
    return task_records.TaskRecords(SPEC, "tcp://127.0.0.1:1", Log())


class Log:
    def __init__(self):
        self.lines = []

    def info(self, message, extra=None):
        self.lines.append(message)

    warning = error = info


def sends_a_large_event_then_hangs(writer, sending):
    """A learner whose event is far larger than the pipe holds: the write takes many rounds."""
    writer.put(("log", ("info", "x" * 20_000_000, False)))
    sending.set()
    time.sleep(600)


def reports_an_error_and_returns(writer, sending):
    """A learner that fails before its session starts, and returns without closing `writer`."""
    writer.put(("error", ("RuntimeError: run directory in use", False)))


def relay_in_thread(events, process):
    outcome = {}

    def run():
        try:
            outcome["result"] = task_module._relay(events, LearnerProcesses([process]), Log(), SPEC,
                                                   multiprocessing.Event(), records())
        except Exception as e:
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def spawn(target, events, sending):
    process = multiprocessing.get_context("spawn").Process(target=target, args=(events.writer, sending))
    process.start()
    events.started()
    return process


def test_a_learner_killed_in_the_middle_of_a_message_is_seen_dead():
    events, sending = EventReader(), multiprocessing.get_context("spawn").Event()
    process = spawn(sends_a_large_event_then_hangs, events, sending)
    assert sending.wait(60)
    time.sleep(1)  # the task is busy (with Prefect's API, say): the pipe fills, the learner's write waits
    os.kill(process.pid, signal.SIGKILL)
    thread, outcome = relay_in_thread(events, process)  # the message's first part is there; the rest never comes
    thread.join(20)
    assert not thread.is_alive(), "the relay hangs on a learner that died mid-message"
    assert outcome == {"result": None}  # died: `learn` stops its actors and fails into a retry


def test_an_event_put_just_before_the_learner_returns_arrives():
    events, sending = EventReader(), multiprocessing.get_context("spawn").Event()
    process = spawn(reports_an_error_and_returns, events, sending)
    thread, outcome = relay_in_thread(events, process)
    process.join(120)  # a spawned process imports this module first: tens of seconds on a loaded machine
    thread.join(30)
    assert "run directory in use" in str(outcome["error"])


class ScriptedEvents:
    def __init__(self, events):
        self.events, self.gone = list(events), False

    def get(self, timeout_s):
        return self.events.pop(0)


def test_the_task_keeps_the_versions_table(monkeypatch):
    recorded = []
    monkeypatch.setattr(task_records, "record_version", lambda **fields: recorded.append(fields))
    def row(version):
        return {"version": version, "step": 4 * version}

    events = ScriptedEvents([("version", {"version": 3, "row": row(3)}),
                             ("version", {"version": 4, "row": row(4)}),
                             ("done", {"step": 16, "version": 4, "stopped": "steps", "message": "reached learner.steps (16)"})])
    result = task_module._relay(events, SimpleNamespace(failed=lambda: False), Log(), SPEC, multiprocessing.Event(),
                                records())
    assert result["step"] == 16
    assert [[r["version"] for r in fields["rows"]] for fields in recorded] == [[3], [3, 4]]


def test_a_ctrl_c_reaches_the_learner_while_the_task_waits_on_prefect(monkeypatch):
    """A version's record that takes seconds (a loaded or remote Prefect server) does not
    hold a Ctrl-C back from the learner: it would train on to a later version."""
    stop, passed = multiprocessing.Event(), []

    def slow_record(**fields):
        INTERRUPT.request(signal.SIGINT)
        passed.append(stop.wait(3))  # the call lasts until the stop is passed on, or 3 s

    monkeypatch.setattr(task_records, "record_version", slow_record)
    events = ScriptedEvents([("version", {"version": 1, "row": {"version": 1, "step": 4}}),
                             ("done", {"step": 4, "version": 1, "stopped": "interrupted", "message": "interrupted"})])
    processes = SimpleNamespace(failed=lambda: False, terminate=lambda: None)
    try:
        result = task_module._relay(events, processes, Log(), SPEC, stop, records())
    finally:
        INTERRUPT.clear()
    assert passed == [True] and result["stopped"] == "interrupted"


def test_warnings_of_parts_without_a_log_reach_the_task():
    events = EventReader()
    forwarder = LogForwarder(events.writer)
    forwarder.install()
    try:
        logging.getLogger("tasks.background").warning("tandem-weight-publisher did not stop within 10s")
        assert events.get(timeout_s=10) == ("log", ("warning", "tandem-weight-publisher did not stop within 10s", False))
    finally:
        logging.getLogger("tasks").removeHandler(forwarder)
        logging.getLogger("tasks").propagate = True
