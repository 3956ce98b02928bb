"""Episodes a person can read: `RUN_DIR/episodes/v{N}.jsonl`, one JSON object per episode.

Each holds the prompt, every turn's observation and action as text with the versions
that generated the action's tokens, the reward, success, and the reason its group was
excluded, if it was. Training keeps a few episodes per version (the version that began
them), the oldest versions' files removed once they pass a size budget; an evaluation
keeps all of its own, in `episodes/eval/v{N}.jsonl`, never removed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from learner.chat import ChatTokenizer
from learner.trajectory import OBSERVATION, Group, Sample

DIRECTORY = "episodes"
EVAL_DIRECTORY = "episodes/eval"


def turns(sample: Sample, tokenizer: ChatTokenizer) -> list[dict]:
    """The episode as turns: each observation and the action that answered it, as text."""
    generated = sample.versions != OBSERVATION
    # A run of observation tokens, then a run of action tokens: one turn.
    edges = np.flatnonzero(np.diff(generated.astype(np.int8))) + 1
    runs = np.split(np.arange(len(sample.tokens)), edges)
    out = []
    for run in runs:
        text = tokenizer.decode(sample.tokens[run].tolist())
        if not generated[run[0]]:
            out.append({"observation": text, "action": "", "versions": []})
        else:
            out[-1] |= {"action": text, "versions": sorted(set(sample.versions[run].tolist()))}
    return out


def episode_records(group: Group, tokenizer: ChatTokenizer, *, excluded: str | None = None,
                    limit: int | None = None) -> list[dict]:
    """Up to `limit` of the group's episodes as records; one without turns if it has none
    (an aborted group)."""
    head = {"prompt_id": group.prompt_id, "attempt": group.attempt, "prompt": group.prompt,
            "excluded": excluded if excluded is not None else group.aborted and "aborted",
            "detail": group.aborted}
    if not group.samples:
        return [{**head, "episode": 0, "reward": 0.0, "success": False, "turns": []}]
    return [{**head, "episode": i, "reward": s.reward, "success": s.success, "turns": turns(s, tokenizer)}
            for i, s in enumerate(group.samples[:limit])]


def first_version(group: Group) -> int:
    """The version that began the group: its oldest action token's (0 if it has none)."""
    versions = [int(s.versions[s.versions != OBSERVATION].min()) for s in group.samples if s.generated.any()]
    return min(versions, default=0)


class EpisodeSample:
    """Training's sample: the first `per_version` episodes of each version, one per group,
    in `directory/v{N}.jsonl`; past `max_bytes` in all, the oldest versions' files go."""

    def __init__(self, directory: Path, tokenizer: ChatTokenizer, per_version: int, max_bytes: int):
        self.directory, self.tokenizer = directory, tokenizer
        self.per_version, self.max_bytes = per_version, max_bytes
        self._kept: dict[int, int] = {}  # version -> episodes written this session
        # Bytes of each version's file, oldest first: read once, then kept up to date here
        # (a version a step would otherwise mean a directory scan per episode).
        files = sorted(directory.glob("v*.jsonl"), key=lambda p: int(p.stem[1:])) if directory.is_dir() else []
        self._sizes = {int(p.stem[1:]): p.stat().st_size for p in files}

    def add(self, groups: list[Group]) -> None:
        """Keeps an episode of each group while its version wants more."""
        for group in groups:
            version = first_version(group)
            if self._kept.get(version, 0) >= self.per_version:
                continue
            self._kept[version] = self._kept.get(version, 0) + 1
            (record,) = episode_records(group, self.tokenizer, limit=1)
            line = json.dumps({"version": version, **record}) + "\n"
            self.directory.mkdir(parents=True, exist_ok=True)
            with (self.directory / f"v{version}.jsonl").open("a") as f:
                f.write(line)
            self._sizes[version] = self._sizes.get(version, 0) + len(line.encode())
            self._rotate(keep=version)

    def _rotate(self, keep: int) -> None:
        total = sum(self._sizes.values())
        for version in sorted(self._sizes):
            if total <= self.max_bytes or version == keep:
                break
            total -= self._sizes.pop(version)
            (self.directory / f"v{version}.jsonl").unlink(missing_ok=True)


def write_eval_episodes(run_dir: Path, version: int, records: list[dict]) -> Path:
    """Every episode of version `version`'s evaluation, replacing an earlier one's."""
    path = run_dir / EVAL_DIRECTORY / f"v{version}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"version": version, **r}) + "\n" for r in records))
    return path


def read_episodes(path: Path) -> list[dict]:
    """The records of an episodes file (a torn last line skipped)."""
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
