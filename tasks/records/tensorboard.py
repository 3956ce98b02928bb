"""Metrics records as TensorBoard events (`tensorboard --logdir RUN_DIR/tensorboard`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tensorboardX import SummaryWriter

from tasks.records.step import StepRecord

# Record fields that are not per-step measurements.
_NOT_SCALARS = {"step", "version", "time"}


class TensorBoardLog:
    """Writes one metrics record per step: numeric fields as scalars (`version` too, so
    steps and versions line up), `excluded/<reason>` counts, a `staleness` histogram.

    A run resumed at step S passes `resume_step=S`: TensorBoard then hides the events of
    later steps written before the crash, as `metrics.jsonl` drops those records.
    """

    def __init__(self, log_dir: Path, resume_step: int = 0, flush_secs: int = 10):
        self.writer = SummaryWriter(str(log_dir), flush_secs=flush_secs,
                                    purge_step=resume_step + 1 if resume_step else None)

    def write(self, record: StepRecord) -> None:
        self.add(record.to_json())

    def add(self, record: dict) -> None:
        """Writes one record as `metrics.jsonl` holds it."""
        step, walltime = record["step"], record["time"]
        scalars = {k: v for k, v in record.items()
                   if k not in _NOT_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool)}
        scalars["version"] = record["version"]
        scalars |= {f"excluded/{reason}": n for reason, n in record.get("excluded", {}).items()}
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step, walltime=walltime)
        hist = record.get("staleness_hist", {})
        if hist:
            values = np.repeat([int(k) for k in hist], list(hist.values()))
            edges = np.arange(values.max() + 2) - 0.5  # one bin per staleness value
            self.writer.add_histogram("staleness", values, step, walltime=walltime, bins=edges)

    def close(self) -> None:
        self.writer.close()


def rewrite_events(log_dir: Path, records: list[dict]) -> None:
    """Replaces `log_dir`'s event files with events of `records` (the whole run)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in log_dir.glob("events.out.tfevents.*"):
        old.unlink()
    log = TensorBoardLog(log_dir)
    try:
        for record in records:
            log.add(record)
    finally:
        log.close()


def add_eval(writer: SummaryWriter, record: dict) -> None:
    """A version's eval record (`metrics.jsonl`) as `eval/<score>` scalars at its step."""
    for name, value in record["eval"].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            writer.add_scalar(f"eval/{name}", value, record["step"], walltime=record["time"])


def rewrite_eval_events(log_dir: Path, evals: list[dict]) -> None:
    """Replaces `log_dir`'s event files with the eval records `evals` (a run of their own)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in log_dir.glob("events.out.tfevents.*"):
        old.unlink()
    writer = SummaryWriter(str(log_dir))
    try:
        for record in evals:
            add_eval(writer, record)
    finally:
        writer.close()
