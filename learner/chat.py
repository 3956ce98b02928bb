"""Tokenizers as the actors see them: text <-> ids, stop tokens, and how turns are framed.

An episode is one token sequence: `start()`, then for each turn an observation
framed by `observation(text, first=...)` and the policy's action, which ends with
one of `stop_ids`. The char tokenizer frames nothing (observations are their bare
characters); a Hugging Face tokenizer frames each observation as a user message
followed by the assistant's generation prompt, exactly as its chat template would
render the whole conversation, so a checkpoint's instruction tuning carries over.
"""

from __future__ import annotations

import json
import pathlib
from typing import Protocol, Sequence

import jinja2.sandbox
from tokenizers import Tokenizer

from learner.config import FieldError, ModelConfig, TokenizerConfig
from learner.tokenizer import BOS, EOS, CharTokenizer

# Stand-ins rendered through the chat template, then cut out to find the framing.
_SLOTS = ("\x00obs0\x00", "\x00act\x00", "\x00obs1\x00")


class ChatTokenizer(Protocol):
    """What rollouts need from a tokenizer."""

    vocab_size: int  # ids are < vocab_size (<= the model's embedding rows)
    stop_ids: tuple[int, ...]  # an action ends at any of these (pass to `Sampler`)

    def encode(self, text: str) -> list[int]:
        """Ids of plain text; ValueError if it cannot be encoded."""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of an action: up to its first stop id, special tokens dropped."""

    def start(self) -> list[int]:
        """Ids every episode begins with (before its first observation)."""

    def observation(self, text: str, *, first: bool) -> list[int]:
        """Ids of an observation turn, ending where the policy's next action begins."""

    def observation_text(self, ids: Sequence[int]) -> str:
        """The text of an observation turn's ids, without its framing: what the environment wrote."""


class CharChat:
    """The char tokenizer: episodes start with bos, observations are bare, eos ends an action."""

    stop_ids = (EOS,)

    def __init__(self, config: TokenizerConfig):
        self._chars = CharTokenizer(config)
        self.vocab_size = self._chars.vocab_size

    def encode(self, text: str) -> list[int]:
        return self._chars.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._chars.decode(ids)

    def start(self) -> list[int]:
        return [BOS]

    def observation(self, text: str, *, first: bool) -> list[int]:
        return self.encode(text)

    def observation_text(self, ids: Sequence[int]) -> str:
        return self.decode(ids)


class HFChat:
    """A checkpoint's `tokenizer.json`, its special tokens and (if any) its chat template.

    Without a chat template an episode starts with the bos token (if the tokenizer
    has one) and observations are bare text, as with the char tokenizer.
    """

    def __init__(self, path: str | pathlib.Path):
        path = pathlib.Path(path)
        if not (path / "tokenizer.json").is_file():
            raise FieldError("tokenizer.path", f"no tokenizer.json in {path}")
        self._tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        settings = _read_json(path / "tokenizer_config.json")
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.stop_ids = _stop_ids(path, settings, self._tokenizer)
        self._bos = _token_text(settings.get("bos_token"))
        template = _chat_template(path, settings)
        self._framing = self._frame(template) if template else None
        # The framing as this tokenizer decodes it (`observation_text`): byte-level BPE gives
        # back the very text encoded; one that joins tokens with spaces (word-level) adds some.
        self._decoded_framing = None if self._framing is None else tuple(
            self._tokenizer.decode(self.encode(part), skip_special_tokens=False) for part in self._framing)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        end = next((n for n, i in enumerate(ids) if i in self.stop_ids), len(ids))
        return self._tokenizer.decode(ids[:end], skip_special_tokens=True)

    def start(self) -> list[int]:
        if self._framing or self._bos is None:
            return []  # a chat template writes its own bos
        return self.encode(self._bos)

    def observation(self, text: str, *, first: bool) -> list[int]:
        if self._framing is None:
            return self.encode(text)
        first_prefix, later_prefix, suffix = self._framing
        return self.encode((first_prefix if first else later_prefix) + text + suffix)

    def observation_text(self, ids: Sequence[int]) -> str:
        text = self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
        if self._framing is None:
            return text.removeprefix(self._bos or "")
        first_prefix, later_prefix, suffix = self._decoded_framing
        for prefix in (first_prefix, later_prefix):
            if prefix and text.startswith(prefix):
                text = text[len(prefix):]
                break
        text = text.removesuffix(suffix)
        return text if self._decoded_framing == self._framing else text.strip()  # word-level: spaces trimmed

    def _frame(self, template: str) -> tuple[str, str, str]:
        """(text before the first observation, before a later one, after any one).

        The text a template puts between an action and the next observation starts
        with the end-of-turn token the policy generated itself (a stop id): dropped.
        """
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        render = env.from_string(template).render
        obs0, act, obs1 = _SLOTS
        specials = {"bos_token": self._bos or "", "eos_token": self._tokenizer.id_to_token(self.stop_ids[0])}
        one = render(messages=[{"role": "user", "content": obs0}], add_generation_prompt=True, **specials)
        three = render(messages=[{"role": "user", "content": obs0}, {"role": "assistant", "content": act},
                                 {"role": "user", "content": obs1}], add_generation_prompt=True, **specials)
        first_prefix = one.split(obs0)[0]
        later_prefix, suffix = three.split(act)[1].split(obs1)
        for stop in (self._tokenizer.id_to_token(i) for i in self.stop_ids):
            if stop and later_prefix.startswith(stop):
                later_prefix = later_prefix[len(stop):]
                break
        return first_prefix, later_prefix, suffix


def make_tokenizer(config: ModelConfig) -> ChatTokenizer:
    """The tokenizer a model config names (`model.tokenizer`)."""
    if config.tokenizer.kind == "hf":
        tokenizer = HFChat(config.tokenizer.path)
        if tokenizer.vocab_size > config.vocab_size:
            raise FieldError("tokenizer", f"{tokenizer.vocab_size} ids do not fit the model's vocab {config.vocab_size}")
        return tokenizer
    return CharChat(config.tokenizer)


def _read_json(file: pathlib.Path) -> dict:
    return json.loads(file.read_text()) if file.is_file() else {}


def _token_text(token) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    return token.get("content") if isinstance(token, dict) else token


def _chat_template(path: pathlib.Path, settings: dict) -> str | None:
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    template = settings.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template


def _stop_ids(path: pathlib.Path, settings: dict, tokenizer: Tokenizer) -> tuple[int, ...]:
    """Every eos the checkpoint declares (generation_config.json, config.json, tokenizer)."""
    ids = []
    for file in ("generation_config.json", "config.json"):
        eos = _read_json(path / file).get("eos_token_id")
        ids += eos if isinstance(eos, list) else [eos]
    eos_text = _token_text(settings.get("eos_token"))
    ids.append(tokenizer.token_to_id(eos_text) if eos_text else None)
    stop = tuple(dict.fromkeys(i for i in ids if i is not None))
    if not stop:
        raise FieldError("tokenizer.path", f"{path} declares no eos token, so an action could never end")
    return stop


def _raise(message: str):
    raise jinja2.TemplateError(message)
