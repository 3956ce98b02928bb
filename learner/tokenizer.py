"""A character tokenizer over the alphabet the spec declares."""

from __future__ import annotations

from learner.config import TokenizerConfig

PAD, BOS, EOS = 0, 1, 2
_SPECIAL = 3



class OutsideAlphabet(ValueError):
    """Text holds a character the char tokenizer has no id for."""

    def __init__(self, char: str):
        super().__init__(f"character {char!r} is not in the tokenizer's alphabet")
        self.char = char

class CharTokenizer:
    """Maps each alphabet character to one id; ids 0, 1, 2 are pad, bos, eos.

    Any text environment works with a randomly initialised model as long as its
    observations stay inside the alphabet; text outside it raises `ValueError`.
    """

    def __init__(self, config: TokenizerConfig):
        self.alphabet = config.alphabet
        self._ids = {c: i + _SPECIAL for i, c in enumerate(config.alphabet)}

    @property
    def vocab_size(self) -> int:
        return _SPECIAL + len(self.alphabet)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[c] for c in text]
        except KeyError as e:
            raise OutsideAlphabet(e.args[0]) from None

    def decode(self, ids) -> str:
        """Text of `ids`, stopping at the first eos; pad and bos are skipped."""
        out = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i >= _SPECIAL:
                out.append(self.alphabet[i - _SPECIAL])
        return "".join(out)
