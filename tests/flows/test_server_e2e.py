"""`tandem server start|status|stop`: the local Prefect server, which outlives runs."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.server import healthy, own_server
from tasks.buffer.ledger import balanced
from tests.conftest import ROOT, free_port, tandem
from tests.flows.conftest import TINY

pytestmark = pytest.mark.e2e


def test_server_starts_reports_and_stops_on_another_port(tmp_path):
    port = free_port()
    env = {"TANDEM_PREFECT_PORT": str(port), "PREFECT_HOME": str(tmp_path), "PREFECT_API_URL": "",
           "TANDEM_HOME": str(tmp_path / "tandem")}
    api = f"http://127.0.0.1:{port}/api"
    try:
        started = tandem("server", "start", env=env, timeout=180)
        assert started.returncode == 0 and f"Prefect server at http://127.0.0.1:{port} (started, pid" in started.stdout
        assert healthy(api)
        assert (tmp_path / "tandem" / f"prefect-{port}" / "prefect.db").exists()  # its own, not ~/.prefect's
        assert "(already running" in tandem("server", "start", env=env, timeout=60).stdout

        status = tandem("server", "status", env=env, timeout=60)
        assert status.returncode == 0 and status.stdout.startswith(f"Prefect server at http://127.0.0.1:{port} (pid ")
    finally:
        stopped = tandem("server", "stop", env=env, timeout=60)
    assert stopped.returncode == 0 and stopped.stdout.startswith(f"stopped the Prefect server at http://127.0.0.1:{port}")
    assert not healthy(api)
    assert tandem("server", "status", env=env, timeout=60).returncode == 1


@pytest.mark.slow  # a server's start, its kill and its restart beside a run: ~90 s on 2 cores
def test_a_run_whose_local_server_is_killed_ends_as_it_would_have(tmp_path):
    """The server `tandem run` started dies mid-run: it is started again on its database,
    and the run's records reach it; the run ends as it would have, with one warning."""
    port, run_dir = free_port(), tmp_path / "run"
    env = {**os.environ, "TANDEM_PREFECT_PORT": str(port), "PREFECT_HOME": str(tmp_path), "PREFECT_API_URL": "",
           "TANDEM_HOME": str(tmp_path / "tandem"), "PYTHONPATH": str(ROOT)}
    log = tmp_path / "run.log"
    command = [str(Path(sys.executable).parent / "tandem"), "run", "specs/guess-number.yaml", *TINY,
               "--set", "learner.steps=80", "--set", f"checkpoint.dir={run_dir}"]
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "metrics.jsonl").exists() or len((run_dir / "metrics.jsonl").read_text().splitlines()) < 8:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        pid = own_server(port, home=tmp_path / "tandem" / f"prefect-{port}")
        os.killpg(pid, signal.SIGKILL)  # the server leads its own process group
        code = process.wait(timeout=400)
        output = log.read_text()
        assert code == 0, output[-4000:]
        assert output.count("stopped answering; starting it again") == 1 and "Traceback" not in output
        steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                 if "eval" not in line]
        assert steps == list(range(1, 81))
        assert balanced(json.loads((run_dir / "accounting.json").read_text()))
        api = f"http://127.0.0.1:{port}/api"
        with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            (flow_run,) = client.read_flow_runs()
        assert flow_run.state.is_completed(), flow_run.state  # recorded on the server started again
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        tandem("server", "stop", env={k: v for k, v in env.items() if k != "PYTHONPATH"}, timeout=60)
