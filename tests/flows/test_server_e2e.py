"""`tandem server start|status|stop`: the local Prefect server, which outlives runs."""

import pytest

from flows.server import healthy
from tests.conftest import free_port, tandem

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
