"""The Prefect API a run reports to: `PREFECT_API_URL` if set, else a local server.

The local server listens on loopback, keeps its SQLite database in PREFECT_HOME, and
outlives the run (it is reused by the next one), so the UI keeps showing past runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

DEFAULT_PORT = 4200


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


def ensure_api() -> str:
    """The API URL to use, starting a local server if none is configured."""
    url = configured_api_url()
    if url:
        return url
    url, _ = start_local_server(int(os.environ.get("TANDEM_PREFECT_PORT", DEFAULT_PORT)))
    os.environ["PREFECT_API_URL"] = url
    return url


def ui_url(api_url: str) -> str:
    return api_url.rstrip("/").removesuffix("/api")
