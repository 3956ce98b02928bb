"""The local Prefect server's home and ownership, without starting one: a tiny real process
stands in for a server this project started, a tiny HTTP server for one it did not."""

import http.server
import subprocess
import sys
import threading
import time

import psutil
import pytest

from flows import server
from flows.server import RECORD, ServerRecord, own_server, server_command, server_env, server_home
from tests.conftest import free_port


@pytest.fixture(autouse=True)
def tandem_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    return tmp_path


def started(*argv: str) -> subprocess.Popen:
    """A process that sleeps, its command line `argv` (what `ps` shows of it)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *argv], start_new_session=True)


def recorded(process: subprocess.Popen, port: int, created: float | None = None) -> None:
    home = server_home(port)
    home.mkdir(parents=True, exist_ok=True)
    ServerRecord(process.pid, port, created or psutil.Process(process.pid).create_time()).write(home)


@pytest.fixture
def foreign_server():
    """A Prefect API that nobody here started: /api/health answers 200."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/api/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", free_port()), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()


def test_each_port_has_its_own_home_and_database_and_no_analytics(tandem_home, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://elsewhere:4200/api")
    env = server_env(4310, server_home(4310))
    assert server_home(4310) == tandem_home / "prefect-4310" != server_home(4200)
    assert env["PREFECT_HOME"] == str(tandem_home / "prefect-4310")
    assert env["PREFECT_API_DATABASE_CONNECTION_URL"] == f"sqlite+aiosqlite:///{tandem_home}/prefect-4310/prefect.db"
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert env["PREFECT_UI_API_URL"] == "http://127.0.0.1:4310/api" and "PREFECT_API_URL" not in env


def test_a_recorded_server_of_ours_is_reported_and_stopped(capsys):
    port, process = free_port(), started("prefect", "server", "start")
    try:
        recorded(process, port)
        assert own_server(port) == process.pid
        assert server_command("status", port) == 0
        assert capsys.readouterr().out.startswith(f"Prefect server at http://127.0.0.1:{port} (pid {process.pid}, ")
        assert server_command("stop", port) == 0
        assert capsys.readouterr().out == f"stopped the Prefect server at http://127.0.0.1:{port} (pid {process.pid})\n"
        assert process.wait(10) is not None and not (server_home(port) / RECORD).exists()
    finally:
        process.kill()


@pytest.mark.parametrize("case", ["not a prefect server", "dead", "its pid reused"])
def test_a_record_of_no_live_server_of_ours_is_dropped_and_nothing_stopped(case, capsys):
    port = free_port()
    process = started("prefect", "server", "start") if case != "not a prefect server" else started("sleeper")
    try:
        recorded(process, port, created=time.time() - 3600 if case == "its pid reused" else None)
        if case == "dead":
            process.kill()
            process.wait(10)
        assert own_server(port) is None and not (server_home(port) / RECORD).exists()
        assert server_command("stop", port) == 0
        assert capsys.readouterr().out == f"no Prefect server at http://127.0.0.1:{port}\n"
        assert case == "dead" or process.poll() is None  # still running: not ours to stop
    finally:
        process.kill()


def test_a_server_this_project_did_not_start_is_reported_and_never_stopped(foreign_server, capsys, monkeypatch):
    port = foreign_server
    monkeypatch.setattr(server, "stop_local_server", lambda *a: pytest.fail("stopped a foreign server"))
    url = f"http://127.0.0.1:{port}"
    assert server_command("status", port) == 0
    assert capsys.readouterr().out.startswith(f"a Prefect server this project did not start answers at {url}")
    assert server_command("stop", port) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"a Prefect server this project did not start answers at {url}")
    assert out.endswith("; not stopped\n")
    assert server_command("start", port) == 1 and "not started" in capsys.readouterr().out
    assert server.healthy(f"{url}/api")


def test_a_run_reports_to_a_foreign_server_without_calling_it_its_own(foreign_server, monkeypatch):
    monkeypatch.setattr(server, "configured_api_url", lambda: None)
    monkeypatch.setenv("TANDEM_PREFECT_PORT", str(foreign_server))
    monkeypatch.setenv("PREFECT_API_URL", "")
    assert server.ensure_api() == (f"http://127.0.0.1:{foreign_server}/api", "foreign")
