"""The data source: prompts with ids, retried prompts ahead of new ones, a checkpointable cursor."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import random
import stat
from pathlib import Path
from typing import BinaryIO, Iterator

from learner.config import FieldError
from tasks.config import DataConfig


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One attempt at a prompt: `id` is stable across retries, `attempt` counts them."""

    id: int
    text: str
    attempt: int = 0

    def to_wire(self) -> list:  # msgpack-encodable, for Dask queues
        return [self.id, self.text, self.attempt]

    @classmethod
    def from_wire(cls, wire: list) -> "Prompt":
        return cls(*wire)


def prompt_message(version: int, prompts: list[Prompt]) -> dict:
    """What an actor is sent: prompts, with the oldest version it may play them with (the
    version they were dispatched at where that matters, see `Exchange`; in
    synchronous mode a batch is dispatched just as its version is published)."""
    return {"version": version, "prompts": [p.to_wire() for p in prompts]}


class PromptSource:
    """Draws new prompts deterministically: prompt `i` depends only on (seed, i).

    So a restored cursor replays exactly the prompts a crashed run would have drawn next.
    """

    def __init__(self, config: DataConfig, env_class: type, env_kwargs: dict, seed: int,
                 held_out: frozenset[str] = frozenset()):
        """`held_out`: prompts training never draws (the eval's, `tasks.eval.prompts`)."""
        self.seed = seed
        self.cursor = 0  # ids of new prompts drawn so far: 0 .. cursor-1
        self._again: collections.deque[Prompt] = collections.deque()
        if config.source == "env":
            env = env_class(**env_kwargs)
            self._text = lambda i: draw_outside(env, f"{seed}:{i}", held_out)
        else:
            lines = [line for line in read_jsonl(Path(config.source)) if line not in held_out]
            if not lines:
                raise FieldError("data.source", f"every prompt of {config.source} is an eval prompt (eval.prompts)")
            self._text = lambda i: lines[i % len(lines)]

    def next(self) -> Prompt:
        if self._again:
            return self._again.popleft()
        prompt = Prompt(self.cursor, self._text(self.cursor))
        self.cursor += 1
        return prompt

    def again(self, prompt: Prompt) -> None:
        """Queues `prompt` to be drawn before any new prompt (a retry or a resumed one)."""
        self._again.append(prompt)

    @property
    def waiting(self) -> list[Prompt]:
        return list(self._again)

    def state(self) -> dict:
        return {"cursor": self.cursor, "again": [p.to_wire() for p in self._again]}

    def restore(self, state: dict) -> None:
        self.cursor = state["cursor"]
        self._again = collections.deque(Prompt.from_wire(w) for w in state["again"])


MAX_REDRAWS = 1000  # draws of one prompt id that may all be held out before giving up


def draw_outside(env, seed: str, held_out: frozenset[str]) -> str:
    """The environment's task for `seed`, drawn again (seeds `seed:r`) while it is held out."""
    text = env.task(random.Random(seed))
    for r in range(1, MAX_REDRAWS + 1):
        if text not in held_out:
            return text
        text = env.task(random.Random(f"{seed}:{r}"))
    raise FieldError("eval.n", f"{MAX_REDRAWS} draws of training prompts were all eval prompts "
                     f"({len(held_out)} held out): the environment has too few tasks; hold out fewer")


# A data file is read whole into memory, in every process that draws prompts: a bound far
# above any prompt set, far below what a device file or a mistaken path could hold.
MAX_DATA_BYTES = 2**30


def read_jsonl(path: Path, field: str = "data.source") -> list[str]:
    """The prompts of a JSONL file, one {"prompt": "..."} per line (blank lines skipped).

    Raises ValueError naming `field`, the file and, for a bad line, its number.
    """
    prompts = []
    for n, line in data_lines(path, field):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FieldError(field, f"{path} line {n}: not UTF-8 (byte 0x{line[e.start]:02x} at "
                             f"offset {e.start} of the line); JSON Lines files are UTF-8") from None
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise FieldError(field, f"{path} line {n}: not JSON ({e.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise ValueError(f'{field}: {path} line {n}: expected {{"prompt": "..."}}')
        prompts.append(record["prompt"])
    if not prompts:
        raise FieldError(field, f"{path} holds no prompts")
    return prompts


def data_lines(path: Path, field: str) -> Iterator[tuple[int, bytes]]:
    """The file's lines (split on "\\n" only), numbered from 1, read one at a time."""
    try:
        file = open_regular(path, MAX_DATA_BYTES, "a data file")
    except OSError as e:
        raise FieldError(field, f"cannot read {path}: {e.strerror}") from None
    except Unreadable as e:
        raise FieldError(field, str(e)) from None
    except ValueError as e:  # a name the OS cannot take (a NUL byte in it)
        raise FieldError(field, f"cannot read {str(path)!r}: {e}") from None
    with file:
        read = 0
        for n, line in enumerate(file, 1):
            read += len(line)
            if read > MAX_DATA_BYTES:  # it grew since it was opened
                raise FieldError(field, f"{path} holds more than a data file may ({_size(MAX_DATA_BYTES)})")
            yield n, line.removesuffix(b"\n")


class Unreadable(ValueError):
    """A file Tandem will not read: not a regular file, or larger than its bound."""


def open_regular(path: Path, max_bytes: int, what: str) -> BinaryIO:
    """`path` opened for reading, if it is a regular file of at most `max_bytes`: read to
    its end, a device (/dev/zero) never ends, and opening a FIFO waits for a writer.

    Raises Unreadable saying which (`what` names what the file should be: "a spec"),
    OSError where it cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, without a writer
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(f"{path} is not a regular file ({_kind(info.st_mode)})")
        if info.st_size > max_bytes:
            raise Unreadable(f"{path} holds {info.st_size} bytes, more than {what} may ({_size(max_bytes)})")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _kind(mode: int) -> str:
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")]
    return next((name for test, name in kinds if test(mode)), "not a file")


def _size(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"
