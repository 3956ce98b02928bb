"""Failures no retry can fix do not burn the learner task's Prefect retries: an
environment that imports where `tandem run` checks it but not where the actors run (not
installed on the workers, say) fails the run once, with its error."""

import os
import time

import pytest

from tests.conftest import ROOT, tandem

pytestmark = pytest.mark.e2e

MODULE = '''
import distributed

from tasks.actors.envs.guess_number import GuessNumber

try:
    distributed.get_worker()
except ValueError:  # not on a Dask worker: `tandem run`'s check, the learner process
    pass
else:
    raise ImportError("missing_on_workers is not installed on the actors' workers")


class Env(GuessNumber):
    pass
'''


@pytest.mark.slow  # 21-26 s on 2 cores: CI's time (README, "The two commands")
def test_an_environment_the_actors_cannot_import_fails_the_run_without_retries(prefect_api, tmp_path):
    (tmp_path / "missing_on_workers.py").write_text(MODULE)
    started = time.monotonic()
    result = tandem("run", "specs/guess-number.yaml", "--set", "env.entrypoint=missing_on_workers:Env",
                    "--set", "learner.steps=8", "--set", f"checkpoint.dir={tmp_path / 'run'}",
                    env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "XLA_FLAGS": ""}, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    assert "not installed on the actors' workers" in output
    assert "Retry 1/2" not in output and "resumed from" not in output, "the learner task was retried"
    assert time.monotonic() - started < 120, output[-4000:]
