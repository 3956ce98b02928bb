import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from learner import bpe
from learner.chat import HFChat


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bpe")
    bpe.train(out, vocab_size=2_000, corpus_bytes=400_000)
    return out


def test_the_corpus_is_the_same_for_the_same_seed_and_its_size():
    first = list(bpe.corpus(50_000, seed=3))
    assert first == list(bpe.corpus(50_000, seed=3)) and first != list(bpe.corpus(50_000, seed=4))
    assert 50_000 <= sum(len(line.encode()) + 1 for line in first) < 52_000


def test_vocabulary_specials_and_round_trip(tokenizer_dir):

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == 2_000
    assert [tokenizer.token_to_id(t) for t in bpe.SPECIAL] == [0, 1, 2]
    text = 'Wéird text: 12 * 7 = 84\n<tool_call>\n{"name": "calculator"}\n</tool_call>'
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert tokenizer.token_to_id("<tool_call>") in ids  # a tag is one token


def test_chat_template_frames_turns(tokenizer_dir):
    chat = HFChat(tokenizer_dir)
    assert chat.stop_ids == (2,)  # <|im_end|>
    settings = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    assert settings["chat_template"] == bpe.CHAT_TEMPLATE

    episode = chat.start() + chat.observation("hi", first=True)
    text = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).decode(episode, skip_special_tokens=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert episode[0] == 1 and np.all(np.array(episode) < 2_000)


def test_digits_are_tokens_of_their_own_as_in_qwen2(tokenizer_dir):
    """A number is its digits wherever it stands, so copying it is copying the same ids."""
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    digits = tokenizer.encode("1425").ids
    assert len(digits) == 4
    for text in (" 1425", "(1425", "<result> 1425</result>", "has 1425 marbles"):
        ids = tokenizer.encode(text).ids
        assert any(ids[i:i + 4] == digits for i in range(len(ids))), text
