"""A byte-level BPE tokenizer with a ChatML chat template, trained here on generated text.

No model hub is reachable from where Tandem is developed and tested, so a model of LLM
shape gets its tokenizer from this module: the `tokenizers` library's BPE trainer
(Sennrich et al. 2016, byte-level as in GPT-2) over text `corpus` writes, which mixes what
an agent's conversations hold: prose over a lexicon of invented words with Zipf-distributed
frequencies (so that there are tens of thousands of merges to learn), numbers, arithmetic,
tool calls as JSON between tags, and code. Special tokens and the template follow Qwen2's
(`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`; `<tool_call>` tags as added tokens), and so
does the pre-tokenization (its tokenizer.json's split pattern): every digit is a token of its
own, so a number reads as the same digits wherever it stands ("37", " 37", "(37") and an
agent copies it digit by digit, as Qwen2 does (a merged " 37" and "37" are different ids).
"""

from __future__ import annotations

import itertools
import json
import pathlib
import random
from collections.abc import Iterator

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL = (PAD, IM_START, IM_END)
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
# Qwen2's pre-tokenizer split (Qwen2 tokenizer.json): contractions, words with one leading
# non-letter, single digits, punctuation runs, newlines, spaces.
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_COMMON = ("the a an of to and in is it that for on with as at by from this be are was or not "
           "you your we our they what which when how many much result answer tool call error "
           "number total each more than less step then so if else return value name user assistant system").split()
_ONSETS = ("", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
           "br", "ch", "cl", "dr", "fl", "gr", "kr", "pl", "qu", "sh", "sl", "st", "str", "th", "tr")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "io", "oo", "ou", "y")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "rt", "st", "x", "ck")
_TOOLS = ("calculator", "search", "weather", "lookup", "python", "convert", "calendar")


def corpus(size_bytes: int, *, seed: int = 0, lexicon: int = 40_000) -> Iterator[str]:
    """Lines of generated text, `size_bytes` in all, the same for the same arguments."""
    rng = random.Random(seed)
    words = _COMMON + list(dict.fromkeys(_word(rng) for _ in range(lexicon)))
    # Zipf's law, as cumulative weights: `choices` would otherwise sum all 40k weights per call.
    weights = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))
    kinds = (_prose, _prose, _prose, _arithmetic, _tool_call, _code)
    written = 0
    while written < size_bytes:
        line = rng.choice(kinds)(rng, words, weights)
        written += len(line.encode()) + 1
        yield line


def train(out: str | pathlib.Path, *, vocab_size: int = 32_768, corpus_bytes: int = 8_000_000,
          seed: int = 0) -> Tokenizer:
    """Trains the tokenizer and writes `tokenizer.json` and `tokenizer_config.json` (with the
    chat template) into `out`, as a Hugging Face checkpoint directory holds them."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(TOOL_TAGS), special_tokens=list(SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus(corpus_bytes, seed=seed), trainer=trainer)
    tokenizer.add_tokens(list(TOOL_TAGS))
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": IM_END,
                "pad_token": PAD, "chat_template": CHAT_TEMPLATE, "model_max_length": 32_768}
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    return tokenizer


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS)
                   for _ in range(rng.choice((1, 1, 2, 2, 2, 3, 3, 4))))


def _prose(rng: random.Random, words: list[str], weights: list[float]) -> str:
    sentences = []
    for _ in range(rng.randint(1, 4)):
        chosen = rng.choices(words, cum_weights=weights, k=rng.randint(4, 18))
        if rng.random() < 0.3:
            chosen.insert(rng.randrange(len(chosen)), str(rng.randint(0, 10 ** rng.randint(1, 6))))
        sentence = " ".join(chosen)
        sentences.append(sentence[0].upper() + sentence[1:] + rng.choice(".....?!:"))
    return " ".join(sentences)


def _arithmetic(rng: random.Random, words: list[str], weights: list[float]) -> str:
    a, b = rng.randint(0, 10 ** rng.randint(1, 5)), rng.randint(1, 10 ** rng.randint(1, 4))
    op = rng.choice("+-*/")
    value = {"+": a + b, "-": a - b, "*": a * b, "/": round(a / b, 4)}[op]
    return f"{a} {op} {b} = {value}. {' '.join(rng.choices(words, cum_weights=weights, k=rng.randint(2, 8)))}"


def _tool_call(rng: random.Random, words: list[str], weights: list[float]) -> str:
    tool = rng.choice(_TOOLS)
    argument = (f"{rng.randint(0, 9999)} {rng.choice('+-*/')} {rng.randint(1, 999)}" if tool == "calculator"
                else " ".join(rng.choices(words, cum_weights=weights, k=rng.randint(1, 4))))
    call = json.dumps({"name": tool, "arguments": {"query": argument}})
    reply = json.dumps({"result": rng.choice([str(rng.randint(-999, 99999)), " ".join(rng.choices(words, cum_weights=weights, k=3))])})
    return f"<tool_call>\n{call}\n</tool_call>\n<tool_response>\n{reply}\n</tool_response>"


def _code(rng: random.Random, words: list[str], weights: list[float]) -> str:
    name, arg = (w.replace("-", "_") for w in rng.choices(words, cum_weights=weights, k=2))
    return (f"def {name}({arg}):\n    if {arg} > {rng.randint(0, 100)}:\n        return {arg} * {rng.randint(2, 9)}\n"
            f"    return [{', '.join(str(rng.randint(0, 99)) for _ in range(rng.randint(1, 5)))}]")
