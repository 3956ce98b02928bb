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
from tasks.run_dir import RunDir


def turns(sample: Sample, tokenizer: ChatTokenizer) -> list[dict]:
    """The episode as turns: each observation and the action that answered it, as text."""
    generated = sample.versions != OBSERVATION
    # A run of observation tokens, then a run of action tokens: one turn.
    edges = np.flatnonzero(np.diff(generated.astype(np.int8))) + 1
    runs = np.split(np.arange(len(sample.tokens)), edges)
    out = []
    for run in runs:
        ids = sample.tokens[run].tolist()
        if not generated[run[0]]:
            out.append({"observation": tokenizer.observation_text(ids), "action": "", "versions": []})
        else:
            out[-1] |= {"action": tokenizer.decode(ids), "versions": sorted(set(sample.versions[run].tolist()))}
    return out


def episode_records(group: Group, tokenizer: ChatTokenizer, *, excluded: str | None = None,
                    limit: int | None = None) -> list[dict]:
    """Up to `limit` of the group's episodes as records; one without turns if it has none
    (an aborted group)."""
    head = {"prompt_id": group.prompt_id, "attempt": group.attempt, "prompt": group.prompt,
            "excluded": excluded if excluded is not None else group.aborted and "aborted",
            "detail": group.aborted.message if group.aborted else None}
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
    in `directory/v{N}.jsonl`; past `max_bytes` in all, the oldest versions' files go.

    One is made per learner attempt, and an attempt after the first (a retry, a resume)
    replays the versions after its checkpoint's. Their files, an attempt rolled back's, are
    rewritten, not appended to: a session's versions only grow from the one it resumed
    from, which plays its first groups, so the files above the first version it takes a
    group of are rolled back ones. That version's own file was played by the same weights
    (the checkpoint's): its episodes count towards `per_version`, as every file's do.
    """

    def __init__(self, directory: Path, tokenizer: ChatTokenizer, per_version: int, max_bytes: int):
        self.directory, self.tokenizer = directory, tokenizer
        self.per_version, self.max_bytes = per_version, max_bytes
        self._kept: dict[int, int] = {}  # version -> episodes its file holds, once this session looked
        self._started = False  # whether this session has taken a group yet
        # Bytes of each version's file, oldest first: read once, then kept up to date here
        # (a version a step would otherwise mean a directory scan per episode).
        files = sorted(directory.glob("v*.jsonl"), key=lambda p: int(p.stem[1:])) if directory.is_dir() else []
        self._sizes = {int(p.stem[1:]): p.stat().st_size for p in files}

    def add(self, groups: list[Group]) -> None:
        """Keeps an episode of each group while its version wants more."""
        if groups and not self._started:
            self._started = True
            self._drop_after(min(first_version(group) for group in groups))
        for group in groups:
            version = first_version(group)
            if self._count(version) >= self.per_version:
                continue
            self._kept[version] += 1
            (record,) = episode_records(group, self.tokenizer, limit=1)
            line = json.dumps({"version": version, **record}) + "\n"
            self.directory.mkdir(parents=True, exist_ok=True)
            with self._path(version).open("a") as f:
                f.write(line)
            self._sizes[version] = self._sizes.get(version, 0) + len(line.encode())
            self._rotate(keep=version)

    def _path(self, version: int) -> Path:
        return self.directory / f"v{version}.jsonl"

    def _drop_after(self, first: int) -> None:
        """Removes the files of versions above `first`: an attempt rolled back played them."""
        for version in [v for v in self._sizes if v > first]:
            self._path(version).unlink(missing_ok=True)
            del self._sizes[version]

    def _count(self, version: int) -> int:
        """Episodes `version`'s file holds; the first time, an earlier session's file is cut
        back to its whole records, at most `per_version` of them."""
        if version not in self._kept:
            path = self._path(version)
            records = read_episodes(path) if path.exists() else []
            if len(records) > self.per_version or (records and not path.read_bytes().endswith(b"\n")):
                records = records[: self.per_version]
                path.write_text("".join(json.dumps(r) + "\n" for r in records))
                self._sizes[version] = path.stat().st_size
            self._kept[version] = len(records)
        return self._kept[version]

    def _rotate(self, keep: int) -> None:
        total = sum(self._sizes.values())
        for version in sorted(self._sizes):
            if total <= self.max_bytes or version == keep:
                break
            total -= self._sizes.pop(version)
            self._path(version).unlink(missing_ok=True)


def eval_episodes_path(run_dir: Path, version: int) -> Path:
    return RunDir(run_dir).eval_episodes / f"v{version}.jsonl"


def write_eval_episodes(run_dir: Path, version: int, records: list[dict]) -> Path:
    """Every episode of version `version`'s evaluation, replacing an earlier one's."""
    path = eval_episodes_path(run_dir, version)
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
