"""The Prefect API a run reports to: `PREFECT_API_URL` if set, else a local server.

The local server listens on loopback (port `TANDEM_PREFECT_PORT`, default 4200), keeps
its SQLite database in PREFECT_HOME, and outlives the run (it is reused by the next one),
so the UI keeps showing past runs; `tandem server stop` stops it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

DEFAULT_PORT = 4200


def local_port() -> int:
    return int(os.environ.get("TANDEM_PREFECT_PORT", DEFAULT_PORT))


def configured_api_url() -> str | None:
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    return str(url) if url else None


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def start_local_server(port: int = DEFAULT_PORT, home: Path | None = None,
                       timeout_s: float = 120.0) -> tuple[str, subprocess.Popen | None]:
    """Starts (or reuses) a server on 127.0.0.1:`port`; returns its API URL and process
    (None when an already running server is reused)."""
    api_url = f"http://127.0.0.1:{port}/api"
    if healthy(api_url):
        return api_url, None
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)
    env["PREFECT_UI_API_URL"] = api_url  # else the UI talks to the API on the default port
    if home is not None:
        env["PREFECT_HOME"] = str(home)
    log_dir = Path(env.get("PREFECT_HOME", Path.home() / ".prefect"))
    log_dir.mkdir(parents=True, exist_ok=True)
    prefect = shutil.which("prefect", path=str(Path(sys.executable).parent)) or "prefect"
    with (log_dir / "tandem-server.log").open("ab") as log:
        process = subprocess.Popen(
            [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if healthy(api_url):
            return api_url, process
        if process.poll() is not None:
            raise RuntimeError(f"prefect server exited ({process.returncode}); see {log_dir / 'tandem-server.log'}")
        time.sleep(0.5)
    process.terminate()
    raise RuntimeError(f"prefect server did not answer within {timeout_s:.0f}s")


def ensure_api() -> tuple[str, str]:
    """The API URL to use, starting a local server if none is configured; and where it
    comes from: "configured", "running" (a local server, reused) or "started"."""
    url = configured_api_url()
    if url:
        return url, "configured"
    url, process = start_local_server(local_port())
    os.environ["PREFECT_API_URL"] = url
    return url, "running" if process is None else "started"


def server_pid(port: int) -> int | None:
    """The Prefect server listening on 127.0.0.1:`port`, if one is."""
    import psutil  # a dependency of distributed

    for connection in psutil.net_connections("tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid:
            try:
                command = " ".join(psutil.Process(connection.pid).cmdline())
            except psutil.Error:
                continue
            if "prefect" in command and "server" in command:
                return connection.pid
    return None


def stop_local_server(port: int, timeout_s: float = 30.0) -> int | None:
    """Stops the Prefect server on `port` (its process group: a server Tandem started is the
    leader of its own); returns its pid, None if none was running."""
    pid = server_pid(port)
    if pid is None:
        return None
    if os.getpgid(pid) == pid:
        os.killpg(pid, signal.SIGTERM)
    else:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    return pid


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ui_url(api_url: str) -> str:
    return api_url.rstrip("/").removesuffix("/api")


def server_command(action: str, port: int | None) -> int:
    """`tandem server start|stop|status`: the local server `tandem run` uses when
    `PREFECT_API_URL` is not set. Exit 0, or 1 for `status` when none is running."""
    port = local_port() if port is None else port
    url = f"http://127.0.0.1:{port}"
    if action == "start":
        try:
            _, process = start_local_server(port)
        except RuntimeError as e:
            print(e, file=sys.stderr)
            return 1
        print(f"Prefect server at {url} ({'started' if process else 'already running'}, pid {server_pid(port)}); "
              f"stop it with: tandem server stop{_port_flag(port)}")
    elif action == "stop":
        pid = stop_local_server(port)
        print(f"stopped the Prefect server at {url} (pid {pid})" if pid else f"no Prefect server at {url}")
    else:
        pid = server_pid(port)
        print(f"Prefect server at {url} (pid {pid})" if pid else f"no Prefect server at {url}")
        return 0 if pid else 1
    return 0


def _port_flag(port: int) -> str:
    return "" if port == local_port() else f" --port {port}"
