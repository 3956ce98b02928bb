import json

import jax
import numpy as np
import pytest

from learner.config import ModelConfig
from learner.hf import load_params, save_params
from learner.model import forward_fn

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5)


def _save_tiny(tmp_path, config_class, model_class, **extra):
    """A randomly initialised HF model saved to tmp_path; every weight (norms, biases) perturbed."""
    torch.manual_seed(0)
    model = model_class(config_class(**SIZES, **extra)).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            # Scales and biases start at one and zero in HF: randomise them so a mapping
            # mistake (a missed transpose, a dropped bias) shows in the logits.
            weight.copy_((1.0 if "norm" in name else 0.0) + 0.2 * torch.randn_like(weight))
    model.save_pretrained(tmp_path)
    return model


def _hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.numpy()


@pytest.mark.parametrize("kind, tie", [("llama", False), ("llama", True), ("qwen2", False)])
def test_flax_logits_match_transformers(tmp_path, kind, tie):
    classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[kind]
    model = _save_tiny(tmp_path, *classes, tie_word_embeddings=tie, rope_theta=5_000.0)
    config = ModelConfig(init=str(tmp_path), max_len=32)
    assert (config.d_model, config.n_kv_heads, config.vocab_size) == (32, 2, 40)
    assert config.qkv_bias == (kind == "qwen2") and config.tie_embeddings == tie and config.rope_theta == 5_000.0
    tokens = np.random.default_rng(0).integers(0, 40, size=(2, 12))
    positions = np.broadcast_to(np.arange(12), (2, 12))
    logits = jax.jit(forward_fn(config))(load_params(config), tokens, positions, np.ones((2, 12), np.int32))
    expected = _hf_logits(model, tokens)
    assert np.abs(expected).max() > 1  # the comparison is not between two near-zero arrays
    np.testing.assert_allclose(logits, expected, atol=1e-4)


def test_spec_sizes_must_agree_with_the_checkpoint(tmp_path):
    _save_tiny(tmp_path, transformers.LlamaConfig, transformers.LlamaForCausalLM)
    with pytest.raises(ValueError, match="d_model"):
        ModelConfig(init=str(tmp_path), d_model=64)
    with pytest.raises(ValueError, match="config.json"):
        ModelConfig(init=str(tmp_path / "missing"))


def test_unsupported_architecture_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "hidden_size": 8, "num_attention_heads": 2}))
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig(init=str(tmp_path))


TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
WORDS = ["[UNK]", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "user", "assistant", "hello", "a", "b", "c"]


def _save_tokenizer(path, template=TEMPLATE):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(WORDS[1:4])
    tokenizer.save(str(path / "tokenizer.json"))
    settings = {"eos_token": "<|im_end|>", "bos_token": None} | ({"chat_template": template} if template else {})
    (path / "tokenizer_config.json").write_text(json.dumps(settings))
    return tokenizer


def test_chat_turns_concatenate_to_the_rendered_conversation(tmp_path):
    from learner.chat import HFChat, make_tokenizer

    _save_tiny(tmp_path, transformers.Qwen2Config, transformers.Qwen2ForCausalLM)
    raw = _save_tokenizer(tmp_path)
    chat = make_tokenizer(ModelConfig(init=str(tmp_path)))
    assert isinstance(chat, HFChat) and chat.stop_ids == (3,) and chat.vocab_size == len(WORDS)
    im_end = chat.stop_ids[0]
    action = chat.encode("a b") + [im_end]  # as the sampler writes it: ending with a stop id
    episode = chat.start() + chat.observation("hello", first=True) + action + chat.observation("c", first=False)
    conversation = ("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\na b<|im_end|>\n"
                    "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n")
    assert episode == raw.encode(conversation, add_special_tokens=False).ids
    assert chat.decode(action + chat.encode("c")) == "a b"
    # `tandem show`: each observation as the environment wrote it, its framing taken off.
    assert chat.observation_text(chat.start() + chat.observation("hello", first=True)) == "hello"
    assert chat.observation_text(chat.observation("c", first=False)) == "c"


def test_without_a_template_observations_are_bare(tmp_path):
    from learner.chat import CharChat, HFChat, make_tokenizer

    _save_tokenizer(tmp_path, template=None)
    chat = HFChat(tmp_path)
    assert chat.start() == [] and chat.observation("hello a", first=True) == [6, 7]
    char = make_tokenizer(ModelConfig())
    assert isinstance(char, CharChat) and char.start() == [1] and char.stop_ids == (2,)
    assert char.decode(char.observation("hi", first=False) + [2, 5]) == "hi"


@pytest.mark.parametrize("kind, tie", [("llama", False), ("qwen2", True)])
def test_saved_params_load_in_transformers_with_the_same_logits(tmp_path, kind, tie):
    classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[kind]
    _save_tiny(tmp_path / "in", *classes, tie_word_embeddings=tie)
    config = ModelConfig(init=str(tmp_path / "in"), max_len=32)
    rng = np.random.default_rng(1)  # trained weights: not those it came with
    params = jax.tree.map(lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(np.float32), load_params(config))
    save_params(params, config, tmp_path / "out")
    model = classes[1].from_pretrained(tmp_path / "out").eval()
    tokens = rng.integers(0, 40, size=(2, 12))
    positions = np.broadcast_to(np.arange(12), (2, 12))
    logits = jax.jit(forward_fn(config))(params, tokens, positions, np.ones((2, 12), np.int32))
    np.testing.assert_allclose(_hf_logits(model, tokens), logits, atol=1e-5)
    reloaded = load_params(ModelConfig(init=str(tmp_path / "out"), max_len=32))
    jax.tree.map(np.testing.assert_array_equal, reloaded, params)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_new_model_of_a_shape_loads_in_transformers_with_the_same_logits(tmp_path, family):
    from learner import bpe
    from learner.hf import save_new_model
    from learner.shapes import Shape

    bpe.train(tmp_path / "tok", vocab_size=500, corpus_bytes=100_000)
    shape = Shape(family, 64, 2, 4, 2, 128, 512, tie_embeddings=family == "qwen2")
    save_new_model(shape, tmp_path / "model", tokenizer=tmp_path / "tok", seed=3, max_len=64)
    config = ModelConfig(init=str(tmp_path / "model"), max_len=32)
    assert config.tokenizer.kind == "hf" and config.vocab_size == 512
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    tokens = np.random.default_rng(0).integers(0, 500, size=(2, 12))
    positions = np.broadcast_to(np.arange(12), (2, 12))
    logits = jax.jit(forward_fn(config))(load_params(config), tokens, positions, np.ones((2, 12), np.int32))
    np.testing.assert_allclose(logits, _hf_logits(model, tokens), atol=1e-5)
    assert model.generation_config.eos_token_id == [2, 0]
