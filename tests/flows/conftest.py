"""One small real run that the end-to-end tests of training, eval, lineage, `tandem show`
and the Prefect UI all read, made once: each such run costs about a minute on 2 cores."""

import json
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import tandem

TINY = ["--set", "learner.batch_groups=4", "--set", "buffer.capacity=8", "--set", "sync.interval=4",
        "--set", "checkpoint.every=1"]


def flow_run_of(client, run_dir: Path):
    """The flow run of the run directory `run_dir`: the one whose spec parameter names it."""
    return next(r for r in client.read_flow_runs() if str(run_dir) in json.dumps(r.parameters.get("spec")))


class FinishedRun(NamedTuple):
    run_dir: Path
    result: subprocess.CompletedProcess


@pytest.fixture(scope="session")
def tiny_run(prefect_api, tmp_path_factory) -> FinishedRun:
    """guess-number for 12 steps of 4 groups (versions 1-3 at steps 4, 8, 12, each
    checkpointed; versions 2 and 3 evaluated) through the session's Prefect server and a Dask
    cluster of the run's own. Read it; a test that changes a run works on a copy."""
    run_dir = tmp_path_factory.mktemp("tiny") / "run"
    result = tandem("run", "specs/guess-number.yaml", *TINY, "--set", "learner.steps=12", "--set", "eval.every=2",
                    "--set", f"checkpoint.dir={run_dir}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return FinishedRun(run_dir, result)
