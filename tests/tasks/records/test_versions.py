"""How the versions table and the lineage show in the open-source Prefect UI (pure: no server)."""

from tasks.records.artifacts import run_key
from tasks.records.versions import WARMUP_PARENT, VersionTable, lineage_markdown, readable_rows, significant

CHECKPOINTED = [{"version": 40, "step": 40, "checkpoint": "/runs/g/checkpoints/40", "parent": 20,
                 "reward_mean": 0.8124999999999999, "time": 1767225600.0},
                {"version": 20, "step": 20, "checkpoint": "/runs/g/checkpoints/20", "parent": None,
                 "reward_mean": 0.3333333333333333, "time": 1767225545.25}]


def table() -> VersionTable:
    table = VersionTable(scores=[{"version": 30, "step": 30, "checkpoint": None, "success_rate": 0.5833333333333334,
                           "reward_mean": 0.5833333333333334, "pass_at_1": 0.5833333333333334,
                           "length_mean": 11.916666666666666, "prompts": 12, "episodes": 12}])
    table.add_rows(CHECKPOINTED)
    return table


def test_rows_come_in_version_order_with_every_column_readable():
    """The UI takes a table's columns from its first row: version 20, never evaluated, hid
    every eval score; its time was a raw epoch, its reward 16 digits long."""
    rows = readable_rows(table().rows())
    assert [row["version"] for row in rows] == [20, 30, 40]
    assert [list(row) for row in rows] == [[
        "version", "step", "parent", "checkpoint", "time", "reward_mean", "eval_success_rate", "eval_reward_mean",
        "eval_pass_at_1", "eval_length_mean", "eval_prompts", "eval_episodes"]] * 3
    assert rows[0] == {"version": 20, "step": 20, "parent": None, "checkpoint": "/runs/g/checkpoints/20",
                       "time": "2025-12-31T23:59:05Z", "reward_mean": 0.333, "eval_success_rate": None,
                       "eval_reward_mean": None, "eval_pass_at_1": None, "eval_length_mean": None,
                       "eval_prompts": None, "eval_episodes": None}
    assert rows[1] == {"version": 30, "step": 30, "parent": None, "checkpoint": None, "time": None,
                       "reward_mean": None, "eval_success_rate": 0.583, "eval_reward_mean": 0.583,
                       "eval_pass_at_1": 0.583, "eval_length_mean": 11.9, "eval_prompts": 12, "eval_episodes": 12}
    assert (rows[2]["parent"], rows[2]["reward_mean"], rows[2]["time"]) == (20, 0.812, "2026-01-01T00:00:00Z")
    assert readable_rows([]) == []


def test_three_significant_digits():
    assert [significant(x) for x in (0.8125, 1234.5, -0.000123456, 0.0, 7.0)] == [0.812, 1230.0, -0.000123, 0.0, 7.0]


def test_the_lineage_is_a_mermaid_chain_from_the_spec_to_the_eval_scores():
    markdown = lineage_markdown("guess-number", table().rows(), "guess-number-x-versions")
    assert markdown.startswith("# Lineage of run guess-number\n")
    assert "3 versions (2 with a checkpoint)" in markdown and "`guess-number-x-versions`" in markdown
    assert markdown.split("```mermaid\n")[1].split("\n```")[0].splitlines() == [
        "flowchart TD",
        '  spec["spec.yaml"]',
        '  spec --> v20["v20 · step 20"]',
        '  v20 --> v30["v30 · step 30<br/>no checkpoint"]',
        '  v30 -.- e30(["eval v30: success 58%, reward 0.583"])',
        '  v30 --> v40["v40 · step 40"]']


def test_hundreds_of_versions_show_the_latest_after_an_ellipsis():
    rows = [{"version": v, "step": v, "checkpoint": f"c/{v}"} for v in range(1, 301)]
    diagram = lineage_markdown("r", rows, "r-versions", shown=30).split("```mermaid\n")[1]
    assert '  spec --> earlier["… 270 earlier versions (v1 to v270)"]' in diagram
    assert '  earlier --> v271["v271 · step 271"]' in diagram and "v300" in diagram
    assert diagram.count(" --> ") == 31


def test_a_runs_artifact_key_carries_its_name_as_prefect_allows_it():
    assert run_key("Guess_Number v2", "amber-otter") == "guess-number-v2-amber-otter"
    assert run_key("guess-number", None) == "guess-number"
    assert run_key("ÜBER!", None) == "ber" and run_key("__", None) == "tandem"


def test_a_warmed_up_run_draws_demonstrations_and_the_warm_up_as_version_0_upstream():
    rows = [{"version": 1, "step": 1, "checkpoint": "c/1", "parent": WARMUP_PARENT},
            {"version": 2, "step": 2, "checkpoint": "c/2", "parent": 1}]
    diagram = lineage_markdown("w", rows, "w-versions").split("```mermaid\n")[1].split("\n```")[0]
    assert diagram.splitlines() == [
        "flowchart TD",
        '  spec["spec.yaml"]',
        '  data[("demonstrations")] --> v0',
        '  spec --> v0["v0 · warm-up"]',
        '  v0 --> v1["v1 · step 1"]',
        '  v1 --> v2["v2 · step 2"]']
