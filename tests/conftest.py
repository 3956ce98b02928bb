# Eight virtual CPU devices for the sharding tests. XLA reads the flag when JAX
# initialises its backend, so it must be set before anything imports jax.
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    from tasks import placement  # here: importing Dask before the tests do changes its logging setup

    return placement.free_port("127.0.0.1")


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """A real Prefect server (SQLite, loopback) for the whole session; its API URL."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.server import start_local_server

    home = tmp_path_factory.mktemp("prefect-home")
    url, process = start_local_server(free_port(), home=home)
    os.environ["PREFECT_API_URL"] = url
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="session")
def dask_cluster():
    """A Dask LocalCluster of two worker processes for the session; its scheduler address."""
    from distributed import LocalCluster

    from tasks.actors.cluster import ACTOR_ENV

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0", env=ACTOR_ENV) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="session")
def shipped_models():
    """The model directories shipped specs name (`models/qwen2-25m`, which `make word-problems`
    makes), made here once if absent, as a user makes them: `tandem new-model` (~20 s)."""
    import yaml

    for spec in (ROOT / "specs").glob("*.yaml"):
        init = (yaml.safe_load(spec.read_text()).get("model") or {}).get("init", "random")
        if init.startswith("models/") and not (ROOT / init / "config.json").is_file():
            made = tandem("new-model", Path(init).name, init)
            assert made.returncode == 0, made.stdout + made.stderr


def tandem(*args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Runs the installed `tandem` console script."""
    command = [str(Path(sys.executable).parent / "tandem"), *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, **kwargs)


def pytest_collection_modifyitems(config, items):
    """`slow` tests (long training runs) run only with TANDEM_SLOW=1."""
    if os.environ.get("TANDEM_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set TANDEM_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
