"""`tandem report`: plots and TensorBoard events from a run's metrics; the same plots and
the learner's progress as Prefect artifacts."""

import json
import random
import struct

import matplotlib.image
import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from tensorboardX.proto.event_pb2 import Event

from flows.cli import main
from flows.report import PLOTS, publish_report, render_plots
from flows.spec import parse_spec
from flows.train import _summary
from tasks.records.artifacts import PROGRESS_ARTIFACT, SUMMARY_ARTIFACT, ProgressRecord

STEPS = 24


def realistic_metrics(steps: int = STEPS, seed: int = 0) -> list[dict]:
    """Records shaped like the learner's: cumulative exclusions, per-step staleness counts."""
    rng = random.Random(seed)
    start, excluded, records = 1_800_000_000.0, {"filtered": 0, "aborted": 0}, []
    for step in range(1, steps + 1):
        excluded["filtered"] += rng.randint(0, 3)
        excluded["aborted"] += rng.random() < 0.2
        success = min(1.0, 0.3 + 0.025 * step + rng.uniform(-0.05, 0.05))
        records.append({
            "step": step, "version": (step - 1) // 4, "time": start + 0.8 * step + rng.random(),
            "reward_mean": success, "success_rate": success,
            "learner_busy": rng.uniform(0.2, 0.9), "buffer_depth": rng.randint(0, 16),
            "excluded": dict(excluded), "staleness_hist": {"0": rng.randint(1, 3), "1": rng.randint(0, 2)},
            "compiles": 1, "padding": 0.3, "loss": rng.uniform(-0.1, 0.2), "prompt_ids": [step],
            "entropy": 1.2 * 0.9 ** step, "filtered_share": min(1.0, 0.2 + 0.03 * step + rng.uniform(0, 0.1)),
        })
    return records


def write_metrics(run_dir, records):
    run_dir.mkdir(exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def read_events(path) -> list[Event]:
    """Events of a TFRecord file: length (u64), its CRC, the data, the data's CRC."""
    events, data = [], path.read_bytes()
    while data:
        (length,) = struct.unpack("<Q", data[:8])
        events.append(Event.FromString(data[12:12 + length]))
        data = data[12 + length + 4:]
    return events


def test_report_writes_nontrivial_plots_and_tensorboard_events(tmp_path, capsys):
    write_metrics(tmp_path, realistic_metrics())

    assert main(["report", str(tmp_path)]) == 0

    for name in PLOTS:
        path = tmp_path / "report" / f"{name}.png"
        assert path.stat().st_size > 5_000, name
        pixels = matplotlib.image.imread(path)
        assert pixels.shape[0] > 200 and pixels.shape[1] > 400, name
        assert pixels[..., :3].var() > 1e-3, f"{name} is blank"
    assert str(tmp_path / "report" / "reward.png") in capsys.readouterr().out

    (events_file,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    values = [(v.tag, e.step) for e in read_events(events_file) for v in e.summary.value]
    assert [s for tag, s in values if tag == "reward_mean"] == list(range(1, STEPS + 1))
    assert {"excluded/filtered", "excluded/aborted", "learner_busy", "buffer_depth", "version",
            "staleness"} <= {tag for tag, _ in values}


def test_exclusions_are_the_run_s_totals_as_accounting_json_has_them(tmp_path):
    """Groups go on finishing after the last step: the totals are those written at the end."""
    records = realistic_metrics()
    write_metrics(tmp_path, records)
    accounting = {"excluded": {**records[-1]["excluded"], "filtered": records[-1]["excluded"]["filtered"] + 7}}
    (tmp_path / "accounting.json").write_text(json.dumps(accounting))
    assert main(["report", str(tmp_path)]) == 0
    png = (tmp_path / "report" / "exclusions.png").read_bytes()
    assert png == render_plots(records, accounting)["exclusions"] != render_plots(records)["exclusions"]


def test_reward_line_shows_where_it_equals_the_success_rate(tmp_path):
    """A win scores 1 and a loss 0 (guess-number): the two curves are one; both must show."""
    write_metrics(tmp_path, realistic_metrics())
    assert main(["report", str(tmp_path)]) == 0
    rgb = (matplotlib.image.imread(tmp_path / "report" / "reward.png")[..., :3] * 255).round()
    near = lambda color: (abs(rgb - color).sum(axis=-1) < 40).sum()  # noqa: E731
    assert near((31, 119, 180)) > 300, "reward (tab:blue) hidden"
    assert near((250, 193, 144)) > 300, "success rate (pale tab:orange) hidden"


def test_run_summary_tables_the_exclusions():
    spec = parse_spec("name: demo\n")
    accounting = {"started": 20, "in_flight": 1, "buffered": 2, "consumed": 12, "retried": 1,
                  "excluded": {"filtered": 4, "aborted": 1}}
    markdown = _summary(spec, spec.run_dir, {"step": 12, "version": 3, "stopped": "success",
                                             "accounting": accounting})
    assert "Stopped early at the success target at step 12, version 3." in markdown
    assert "| 20 | 1 | 2 | 12 | 5 | 1 |" in markdown
    assert "| aborted | 1 |\n| filtered | 4 |" in markdown and "{" not in markdown


def test_report_again_replaces_its_events(tmp_path):
    write_metrics(tmp_path, realistic_metrics())
    assert main(["report", str(tmp_path)]) == 0
    assert main(["report", str(tmp_path)]) == 0
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 1


def test_report_of_a_run_without_metrics_fails(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 1
    assert "no metrics recorded" in capsys.readouterr().err


@pytest.mark.e2e
def test_summary_and_progress_artifacts(prefect_api, tmp_path):
    write_metrics(tmp_path, realistic_metrics())

    @flow(name="report-test")
    def finish_run() -> None:
        progress = ProgressRecord(run_name="demo", step=0, version=0, total_steps=STEPS, every_s=3600)
        progress.update(STEPS // 2, 3)  # within every_s: not sent
        progress.finish(STEPS // 2 + 2, 3, "stopped early at the success target", complete=True)  # always sent
        publish_report(tmp_path, run_name="demo", markdown="# demo\n")

    state = finish_run(return_state=True)
    assert state.is_completed()
    with get_client(sync_client=True) as client:
        artifacts = {a.key: a for a in client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))}
    assert artifacts[PROGRESS_ARTIFACT].data == 100.0  # done, though short of its step target
    assert artifacts[PROGRESS_ARTIFACT].description == (
        f"demo: stopped early at the success target at step {STEPS // 2 + 2} of {STEPS}, version 3")
    summary = artifacts[SUMMARY_ARTIFACT].data
    assert summary.startswith("# demo\n")
    assert summary.count("](data:image/png;base64,") == len(PLOTS)


def test_report_plots_the_eval_curve_and_names_the_best_version(tmp_path, capsys):
    from tasks.eval.results import record_eval

    write_metrics(tmp_path, realistic_metrics())
    no_eval = render_plots(realistic_metrics())["reward"]
    for version, success in [(2, 0.25), (4, 0.75), (6, 0.5)]:
        record_eval(tmp_path, version=version, step=4 * version, checkpoint=None, params_bytes=b"w",
                    outcome={"scores": {"prompts": 4, "episodes": 4, "success_rate": success, "reward_mean": success},
                             "episodes": []})
    assert main(["report", str(tmp_path)]) == 0
    assert "Best version by eval score: 4 (step 16): success 75%" in capsys.readouterr().out
    assert (tmp_path / "report" / "reward.png").read_bytes() != no_eval
    (events_file,) = (tmp_path / "tensorboard" / "eval").glob("events.out.tfevents.*")
    values = [(v.tag, e.step, v.simple_value) for e in read_events(events_file) for v in e.summary.value]
    assert [(s, v) for tag, s, v in values if tag == "eval/success_rate"] == [(8, 0.25), (16, 0.75), (24, 0.5)]
    # The run summary names it too.
    summary = _summary(parse_spec(""), tmp_path, {"step": 24, "version": 6, "stopped": "steps", "accounting": {
        "started": 1, "in_flight": 0, "buffered": 0, "consumed": 1, "excluded": {}, "retried": 0}})
    assert "Best version by eval score: **4** (step 16)" in summary and "| 4 (best) | 16 |" in summary


def collapsing_run(run_dir, stopped: dict | None) -> list[dict]:
    """Ten steps: entropy falls below its level at step 6, the filtered share reaches its
    level at step 8; `accounting.json` says how the run ended, if `stopped`."""
    entropies = [0.9, 0.7, 0.5, 0.3, 0.15, 0.09, 0.12, 0.05, 0.03, 0.02]
    shares = [0.1, None, 0.2, 0.4, 0.5, 0.6, 0.75, 0.8, 0.9, 1.0]
    records = [{"step": step, "version": step, "time": 1_800_000_000.0 + step, "reward_mean": 0.5,
                "learner_busy": 0.5, "buffer_depth": 4, "excluded": {"filtered": step}, "entropy": entropy,
                **({"filtered_share": share} if share is not None else {})}
               for step, (entropy, share) in enumerate(zip(entropies, shares), start=1)]
    write_metrics(run_dir, records)
    accounting = {"excluded": {"filtered": 12}, **({"stopped": stopped} if stopped else {})}
    (run_dir / "accounting.json").write_text(json.dumps(accounting))
    return records


def test_report_plots_entropy_and_the_filtered_share_and_says_where_each_crossed_its_level(tmp_path, capsys):
    stopped = {"reason": "no-signal", "message": "every group of the last 50 was filtered", "step": 9,
               "version": 9}
    records = collapsing_run(tmp_path, stopped)

    assert main(["report", str(tmp_path)]) == 0

    out = capsys.readouterr().out
    assert str(tmp_path / "report" / "entropy.png") in out
    assert "Entropy of the trained tokens first fell below 0.1 nats at step 6 (0.09)" in out
    assert "Filtered share first reached 80% at step 8 (80%)" in out
    assert "The run ended (no-signal) at step 9, version 9: every group of the last 50 was filtered" in out
    pixels = matplotlib.image.imread(tmp_path / "report" / "entropy.png")
    assert pixels.shape[0] > 200 and pixels[..., :3].var() > 1e-3
    # The stop is marked on the reward plot.
    assert (tmp_path / "report" / "reward.png").read_bytes() != render_plots(records, {"excluded": {}})["reward"]


def test_report_of_a_run_that_crossed_no_level_and_recorded_no_stop(tmp_path, capsys):
    """A run from before `stopped` was recorded, or one still training: nothing said of its end."""
    records = [{**r, "entropy": 0.5, "filtered_share": 0.1} for r in collapsing_run(tmp_path, stopped=None)]
    write_metrics(tmp_path, records)

    assert main(["report", str(tmp_path)]) == 0

    out = capsys.readouterr().out
    assert "Entropy of the trained tokens stayed at or above 0.1 nats (lowest 0.5, step 1)" in out
    assert "Filtered share stayed below 80% (highest 10%, step 1)" in out
    assert "The run ended" not in out and (tmp_path / "report" / "entropy.png").exists()


def test_report_of_a_run_without_entropy_or_filtered_share(tmp_path, capsys):
    """Runs recorded before `filtered_share` (or a loss without entropy) still report."""
    records = [{k: v for k, v in r.items() if k not in ("entropy", "filtered_share")} for r in realistic_metrics()]
    write_metrics(tmp_path, records)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "report" / "entropy.png").exists()
    assert "Entropy" not in out and "Filtered share" not in out
