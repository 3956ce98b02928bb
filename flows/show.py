"""`tandem show RUN_DIR`: a run's episodes as transcripts a person reads: the prompt, then
each observation and the agent's action, the versions that generated each action, the
reward, and why the episode's group was excluded, if it was (`tasks.records.episodes`)."""

from __future__ import annotations

import sys
from pathlib import Path

from tasks.records.episodes import read_episodes
from tasks.run_dir import RunDir


def episode_files(run_dir: Path, *, evals: bool) -> dict[int, Path]:
    """The run's episode files by version: training's sample, or its evaluations'."""
    directory = RunDir(run_dir).eval_episodes if evals else RunDir(run_dir).episodes
    return {int(p.stem[1:]): p for p in directory.glob("v*.jsonl") if p.stem[1:].isdigit()}


def transcript(record: dict) -> str:
    """One episode as text."""
    outcome = "success" if record.get("success") else "failed"
    head = (f"v{record['version']} · prompt {record['prompt_id']} (attempt {record['attempt']}) · "
            f"episode {record['episode']} · reward {record['reward']:.2f} · {outcome}")
    lines = [head, f"  prompt: {_shown(record['prompt'])}"]
    for turn in record["turns"]:
        lines.append(f"  env:    {_shown(turn['observation'])}")
        versions = ", ".join(f"v{v}" for v in turn["versions"])
        lines.append(f"  agent:  {_shown(turn['action'])}" + (f"   ({versions})" if versions else ""))
    if record.get("excluded"):
        lines.append(f"  excluded: {record['excluded']}" + (f" ({record['detail']})" if record.get("detail") else ""))
    return "\n".join(lines)


def _shown(text: str) -> str:
    """A line of text as Python writes it (an empty action, a space, are visible); text of
    several lines (an LLM's conversation) as it reads, each line under the first."""
    if "\n" not in text.strip("\n"):
        return repr(text)
    return "\n          ".join(text.strip("\n").splitlines())


def show_command(run_dir: Path, *, version: int | None, failed: bool, evals: bool, limit: int) -> int:
    """`tandem show`: exit 0, or 1 when there is no episode to show."""
    files = episode_files(run_dir, evals=evals)
    kind = "evaluated" if evals else "training"
    if not files or (version is not None and version not in files):
        have = f"versions with {kind} episodes: {sorted(files)}" if files else f"no {kind} episodes recorded"
        print(f"{run_dir}: {have}", file=sys.stderr)
        return 1
    version = max(files) if version is None else version
    records = read_episodes(files[version])
    if failed:
        records = [r for r in records if not r.get("success") or r.get("excluded")]
    for record in records[:limit]:
        print(transcript(record) + "\n")
    print(f"{min(limit, len(records))} of {len(records)} {'failed ' if failed else ''}{kind} episodes of "
          f"version {version} ({files[version]})")
    return 0
