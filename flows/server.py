"""The Prefect API a run reports to: `PREFECT_API_URL` if set, else a local server.

The local server listens on loopback (port `TANDEM_PREFECT_PORT`, default 4200) and
outlives the run (it is reused by the next one), so the UI keeps showing past runs;
`tandem server stop` stops it. Each port's server has a home of its own,
`~/.tandem/prefect-<port>/` (`TANDEM_HOME` moves `~/.tandem`), with its SQLite database:
a second server on another port, for another job, shows that job's runs only (two on
one database showed each other's). The home records the server's pid and port, so that
`tandem server status|stop` act only on a server this project started: a Prefect server
someone else started on the port is reported as such and never stopped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

DEFAULT_PORT = 4200
RECORD = "tandem-server.json"  # in the server's home: the pid and port of the server started there


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


def server_home(port: int) -> Path:
    """The home of the local server on `port`: its database, log and record."""
    return Path(os.environ.get("TANDEM_HOME") or Path.home() / ".tandem").expanduser() / f"prefect-{port}"


def server_env(port: int, home: Path) -> dict[str, str]:
    """The environment of the server started on `port`: its own home and SQLite database
    (else every server shares `~/.prefect/prefect.db`), its UI talking to its own API, and
    no analytics (whose notice printed into the terminal of the run that started it)."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return env | {"PREFECT_HOME": str(home),
                  "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
                  "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api",  # else it talks to the default port
                  "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


@dataclasses.dataclass(frozen=True)
class ServerRecord:
    """The server this project started in a home: its pid and port, and when that process
    began (a pid reused by another process after the server's death is not taken for it)."""

    pid: int
    port: int
    created: float

    def write(self, home: Path) -> None:
        (home / RECORD).write_text(json.dumps(dataclasses.asdict(self)) + "\n")

    @classmethod
    def read(cls, home: Path) -> "ServerRecord | None":
        try:
            return cls(**json.loads((home / RECORD).read_text()))
        except (OSError, ValueError, TypeError):
            return None


def start_local_server(port: int = DEFAULT_PORT, home: Path | None = None,
                       timeout_s: float = 120.0) -> tuple[str, subprocess.Popen | None]:
    """Starts (or reuses) a server on 127.0.0.1:`port`, its home `home` (by default
    `server_home(port)`); returns its API URL and process (None when a server already
    answers there, whoever started it)."""
    api_url = f"http://127.0.0.1:{port}/api"
    if healthy(api_url):
        return api_url, None
    home = home or server_home(port)
    home.mkdir(parents=True, exist_ok=True)
    prefect = shutil.which("prefect", path=str(Path(sys.executable).parent)) or "prefect"
    with (home / "tandem-server.log").open("ab") as log:
        process = subprocess.Popen(
            [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env=server_env(port, home), start_new_session=True)
    _record(process.pid, port, home)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if healthy(api_url):
            return api_url, process
        if process.poll() is not None:
            raise RuntimeError(f"prefect server exited ({process.returncode}); see {home / 'tandem-server.log'}")
        time.sleep(0.5)
    process.terminate()
    raise RuntimeError(f"prefect server did not answer within {timeout_s:.0f}s")


def _record(pid: int, port: int, home: Path) -> None:
    import psutil  # a dependency of distributed

    try:
        ServerRecord(pid, port, psutil.Process(pid).create_time()).write(home)
    except psutil.NoSuchProcess:  # it died at once: `start_local_server` says so
        pass


def ensure_api() -> tuple[str, str]:
    """The API URL to use, starting a local server if none is configured; and where it
    comes from: "configured", "running" (the local server this project started, reused),
    "foreign" (a Prefect server someone else started on the port, reported to but never
    stopped) or "started"."""
    url = configured_api_url()
    if url:
        return url, "configured"
    port = local_port()
    url, process = start_local_server(port)
    os.environ["PREFECT_API_URL"] = url
    if process is not None:
        return url, "started"
    return url, "running" if own_server(port) is not None else "foreign"


def own_server(port: int, home: Path | None = None) -> int | None:
    """The pid of the server this project started on `port` (recorded in `home`, by
    default `server_home(port)`), if it still runs; a record of one that does not (dead,
    or its pid now another process's) is removed."""
    home = home or server_home(port)
    record = ServerRecord.read(home)
    if record is None:
        return None
    if record.port == port and _is_server(record):
        return record.pid
    (home / RECORD).unlink(missing_ok=True)
    return None


def _is_server(record: ServerRecord) -> bool:
    """The recorded process is alive, is the one recorded (same start time) and is a Prefect server."""
    import psutil

    try:
        process = psutil.Process(record.pid)
        alive = process.status() != psutil.STATUS_ZOMBIE and abs(process.create_time() - record.created) < 0.01
        command = " ".join(process.cmdline())
    except psutil.Error:
        return False
    return alive and "prefect" in command and "server" in command


def server_pid(port: int) -> int | None:
    """The Prefect server listening on 127.0.0.1:`port`, if one is (whoever started it;
    None also where the system does not tell this user whose a socket is)."""
    import psutil  # a dependency of distributed

    try:
        connections = psutil.net_connections("tcp")
    except psutil.Error:
        return None
    for connection in connections:
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid:
            try:
                command = " ".join(psutil.Process(connection.pid).cmdline())
            except psutil.Error:
                continue
            if "prefect" in command and "server" in command:
                return connection.pid
    return None


def stop_local_server(port: int, timeout_s: float = 30.0) -> int | None:
    """Stops the server this project started on `port` (its process group: it leads its
    own); returns its pid, None if none of ours runs there. Never one started otherwise."""
    pid = own_server(port)
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
    (server_home(port) / RECORD).unlink(missing_ok=True)
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
    `PREFECT_API_URL` is not set. Exit 0, or 1 for `status` when no server answers, for
    `stop` and `start` when one this project did not start holds the port."""
    port = local_port() if port is None else port
    url = f"http://127.0.0.1:{port}"
    ours = own_server(port)
    if ours is None and healthy(f"{url}/api"):
        return _foreign(action, url, port)
    if action == "start":
        try:
            _, process = start_local_server(port)
        except RuntimeError as e:
            print(e, file=sys.stderr)
            return 1
        print(f"Prefect server at {url} ({'started' if process else 'already running'}, pid {own_server(port)}, "
              f"its database {server_home(port) / 'prefect.db'}); stop it with: tandem server stop{_port_flag(port)}")
    elif action == "stop":
        pid = stop_local_server(port)
        print(f"stopped the Prefect server at {url} (pid {pid})" if pid else f"no Prefect server at {url}")
    else:
        print(f"Prefect server at {url} (pid {ours}, its database {server_home(port) / 'prefect.db'})" if ours
              else f"no Prefect server at {url}")
        return 0 if ours else 1
    return 0


def _foreign(action: str, url: str, port: int) -> int:
    """What `tandem server ACTION` says of a Prefect server this project did not start:
    `tandem run` reports to it, but it is not ours to start or stop."""
    pid = server_pid(port)
    who = f"a Prefect server this project did not start answers at {url}" + (f" (pid {pid})" if pid else "")
    if action == "status":
        print(f"{who}: `tandem run` reports to it; `tandem server stop` leaves it running")
        return 0
    if action == "stop":
        print(f"{who}; not stopped")
    else:
        print(f"{who}; not started: `tandem run` reports to it, or use another port (--port, TANDEM_PREFECT_PORT)")
    return 1


def _port_flag(port: int) -> str:
    return "" if port == local_port() else f" --port {port}"


class ServerKeeper:
    """Starts the local server again when it stops answering during a run (killed, or out
    of memory): the same port and home, so the same database; the run's records wait in
    the Prefect client's retries meanwhile (`PREFECT_CLIENT_MAX_RETRIES`, backing off
    2, 4, ... s: about a minute in all with the default 5) and reach it once it answers.
    A run reported to a configured API (`PREFECT_API_URL`) has nothing here to restart."""

    def __init__(self, port: int, warn, every_s: float = 2.0, misses: int = 3):
        self.port, self.warn, self.every_s, self.misses = port, warn, every_s, misses
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tandem-server-keeper", daemon=True)

    def __enter__(self) -> "ServerKeeper":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        api_url, missed = f"http://127.0.0.1:{self.port}/api", 0
        while not self._stop.wait(self.every_s):
            missed = 0 if healthy(api_url) else missed + 1
            if missed < self.misses or self._stop.is_set():
                continue
            self.warn(f"the Prefect server at {ui_url(api_url)} stopped answering; starting it again "
                      "(the run's records wait for it)")
            try:
                start_local_server(self.port)
            except RuntimeError as e:
                self.warn(f"the Prefect server did not start again ({e}); trying again in {self.every_s:.0f}s")
                continue
            self.restarts, missed = self.restarts + 1, 0
