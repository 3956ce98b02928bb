"""Episodes as text: turns decoded from tokens, a few per version, rotated by size."""

import json

import numpy as np

from learner.chat import make_tokenizer
from learner.config import ModelConfig, TokenizerConfig
from learner.trajectory import OBSERVATION, Abort, AbortKind, Group, Sample
from tasks.records.episodes import EpisodeSample, episode_records, first_version, read_episodes, turns

CHAT = make_tokenizer(ModelConfig(tokenizer=TokenizerConfig(alphabet="abc:<>=")))
BOS, EOS = 1, 2


def ids(text):
    return CHAT.encode(text)


def sample(version=3, reward=1.0):
    """bos ':' | 'b' eos (v3) | '<' | 'a' eos (v3, v4)"""
    tokens = [BOS, *ids(":"), *ids("b"), EOS, *ids("<"), *ids("a"), EOS]
    versions = [OBSERVATION] * 2 + [version] * 2 + [OBSERVATION] + [version, version + 1]
    return Sample(np.array(tokens, np.int32), np.zeros(len(tokens), np.float32), np.array(versions, np.int32),
                  reward, reward > 0)


def test_turns_are_each_observation_and_its_action_as_text():
    assert turns(sample(), CHAT) == [{"observation": ":", "action": "b", "versions": [3]},
                                     {"observation": "<", "action": "a", "versions": [3, 4]}]


def test_records_of_a_group_and_of_an_aborted_one():
    group = Group(5, "secret=a", (sample(), sample(reward=0.0)), 0.0, 0.0, attempt=1)
    records = episode_records(group, CHAT)
    assert [(r["episode"], r["reward"], r["success"], r["excluded"]) for r in records] == \
        [(0, 1.0, True, None), (1, 0.0, False, None)]
    assert records[0]["prompt"] == "secret=a" and records[0]["attempt"] == 1
    (aborted,) = episode_records(Group(6, "secret=b", (), 0.0, 0.0, aborted=Abort(AbortKind.TIMEOUT, "timeout after 30s")), CHAT)
    assert (aborted["excluded"], aborted["detail"], aborted["turns"]) == ("aborted", "timeout after 30s", [])
    assert first_version(group) == 3


def test_a_few_episodes_per_version_and_the_oldest_files_go_past_the_budget(tmp_path):
    log = EpisodeSample(tmp_path, CHAT, per_version=2, max_bytes=10**6)
    log.add([Group(i, f"p{i}", (sample(version=v),), 0.0, 0.0) for i, v in enumerate([1, 1, 1, 2])])
    assert [r["prompt"] for r in read_episodes(tmp_path / "v1.jsonl")] == ["p0", "p1"]
    assert [r["version"] for r in read_episodes(tmp_path / "v2.jsonl")] == [2]
    size = (tmp_path / "v1.jsonl").stat().st_size
    small = EpisodeSample(tmp_path, CHAT, per_version=2, max_bytes=size + 1)
    small.add([Group(9, "p9", (sample(version=7),), 0.0, 0.0)])
    assert sorted(p.name for p in tmp_path.glob("v*.jsonl")) == ["v2.jsonl", "v7.jsonl"]  # v1, the oldest, went
    assert sum(p.stat().st_size for p in tmp_path.glob("v*.jsonl")) <= size + 1


def groups_of(versions, prefix):
    return [Group(i, f"{prefix}{i}", (sample(version=v),), 0.0, 0.0) for i, v in enumerate(versions)]


def test_a_resumed_attempt_rewrites_the_versions_after_its_checkpoint_and_never_exceeds_per_version(tmp_path):
    """Each attempt (a retry, a resume) appended again to the versions it replayed: files of
    16 episodes where per_version was 4, most of them from attempts rolled back."""
    first = EpisodeSample(tmp_path, CHAT, per_version=2, max_bytes=10**6)
    first.add(groups_of([1, 1, 2, 2, 3, 3], "old"))  # then it fails; the checkpoint is version 1's
    for attempt in ("retry", "resume"):
        again = EpisodeSample(tmp_path, CHAT, per_version=2, max_bytes=10**6)
        again.add(groups_of([1, 1], attempt))  # the first batch: played by the checkpoint's version
        again.add(groups_of([2, 2, 2], attempt))
    counts = {p.name: len(read_episodes(p)) for p in sorted(tmp_path.glob("v*.jsonl"))}
    assert counts == {"v1.jsonl": 2, "v2.jsonl": 2}  # v3: a version rolled back, not played again
    assert [r["prompt"] for r in read_episodes(tmp_path / "v1.jsonl")] == ["old0", "old1"]  # the same weights
    assert [r["prompt"] for r in read_episodes(tmp_path / "v2.jsonl")] == ["resume0", "resume1"]


def test_a_file_over_its_share_is_cut_back(tmp_path):
    (tmp_path / "v4.jsonl").write_text("".join(json.dumps({"version": 4, "prompt": f"p{i}"}) + "\n" for i in range(16)))
    EpisodeSample(tmp_path, CHAT, per_version=4, max_bytes=10**6).add(groups_of([4], "new"))
    assert [r["prompt"] for r in read_episodes(tmp_path / "v4.jsonl")] == ["p0", "p1", "p2", "p3"]
