"""The Prefect UI, in a real browser (Debian's headless chromium): a finished run's flow run
page lists its artifacts, and the run's `<run>-versions` artifact shows the version table."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from flows.server import ui_url
from tests.flows.conftest import flow_run_of

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("tiny_run")]  # one worker builds the run they read

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def chromium() -> Path:
    """Debian's chromium, installed by apt-get on first use (CI runs as root on a clean machine)."""
    if not CHROMIUM.exists():
        if os.geteuid() != 0:
            pytest.skip("the browser test installs chromium with apt-get, which needs root")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
            subprocess.run(command, env=env, check=True, capture_output=True, timeout=900)
    return CHROMIUM


@pytest.fixture(scope="module")
def finished_run(prefect_api, tiny_run) -> tuple[object, object]:
    """The session's small run (tests/flows/conftest.py): its flow run and `<run>-versions`
    artifact. The session's server is started as `tandem` starts one, its UI talking to its
    own API (`flows.server.server_env`), whatever port it listens on."""
    with get_client(sync_client=True) as client:
        flow_run = flow_run_of(client, tiny_run.run_dir)
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])))
    versions = max((a for a in artifacts if a.key.endswith("-versions")), key=lambda a: a.created)
    return flow_run, versions


def browse(chromium: Path, url: str, profile: Path, *args: str) -> str:
    """Loads `url` headless; the UI is a JS app, so the virtual time budget lets it fetch
    and render before the DOM is dumped or the screenshot taken."""
    command = [str(chromium), "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--no-first-run", f"--user-data-dir={profile}", "--window-size=1400,1000",
               "--virtual-time-budget=20000", *args, url]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=180).stdout


def test_flow_run_page_lists_the_model_versions_artifact(chromium, prefect_api, finished_run, tmp_path):
    flow_run, _ = finished_run
    page = f"{ui_url(prefect_api)}/v2/runs/flow-run/{flow_run.id}?tab=Artifacts"

    dom = browse(chromium, page, tmp_path / "profile-dom", "--dump-dom")
    screenshot = tmp_path / "flow-run-artifacts.png"
    browse(chromium, page, tmp_path / "profile-shot", f"--screenshot={screenshot}")

    assert flow_run.name in dom and "tandem-train" in dom
    assert f"guess-number-{flow_run.name}-versions" in dom and "run-summary" in dom
    assert screenshot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_model_versions_artifact_shows_the_version_table(chromium, prefect_api, finished_run, tmp_path):
    _, artifact = finished_run
    row, *_ = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    page = f"{ui_url(prefect_api)}/v2/artifacts/artifact/{artifact.id}"

    dom = browse(chromium, page, tmp_path / "profile-dom", "--dump-dom")
    screenshot = tmp_path / "versions.png"
    browse(chromium, page, tmp_path / "profile-shot", f"--screenshot={screenshot}")

    assert row["checkpoint"] in dom  # the table's cells: where version 1's weights are
    assert screenshot.stat().st_size > 20_000
