"""A spec whose `model.init` names a Hugging Face checkpoint (a tiny Llama saved by
`transformers` here, with its tokenizer and chat template) runs end to end."""

import json

import pytest

from tasks.buffer.ledger import balanced
from tests.conftest import tandem

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.e2e

TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
WORDS = ["[UNK]", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "user", "assistant",
         *"abcdefghijkl", ":", "<", ">", "=", "?"]


def save_checkpoint(path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    tokenizer.add_special_tokens(WORDS[1:4])
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "bos_token": None, "chat_template": TEMPLATE}))


@pytest.mark.slow  # 63 s on 2 cores: CI's time (README, "The two commands")
def test_spec_with_a_hugging_face_checkpoint_trains(prefect_api, tmp_path):
    checkpoint, run_dir = tmp_path / "tiny-llama", tmp_path / "run"
    checkpoint.mkdir()
    save_checkpoint(checkpoint)
    result = tandem("run", "specs/guess-number.yaml", "--set", f"model={{init: {checkpoint}, max_len: 96}}",
                    "--set", "learner.buckets=[96]", "--set", "learner.steps=4", "--set", "learner.batch_groups=2",
                    "--set", "actors.max_new_tokens=3", "--set", "buffer.filters=[]",
                    "--set", "eval.every=2", "--set", f"checkpoint.dir={run_dir}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    accounting = json.loads((run_dir / "accounting.json").read_text())
    assert accounting["consumed"] == 8 and balanced(accounting)
    spec = (run_dir / "spec.yaml").read_text()
    assert "kind: hf" in spec and "qkv_bias: false" in spec


    # The best evaluated version, exported, loads in transformers with the run's logits.
    out = tmp_path / "exported"
    result = tandem("export", str(run_dir), "--version", "best", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    best = max((json.loads(line) for line in (run_dir / "eval/scores.jsonl").read_text().splitlines()),
               key=lambda s: (s["success_rate"], s["reward_mean"], s["version"]))
    assert f"Version {best['version']} " in result.stdout
    assert exported_logits_match(run_dir, best["version"], out)
    assert "agent:" in tandem("show", str(run_dir), "--eval").stdout


def exported_logits_match(run_dir, version, out) -> bool:
    import jax
    import numpy as np

    from flows.spec import load_spec
    from learner.model import forward_fn
    from tasks.runtime.state.version_weights import version_weights

    spec = load_spec(run_dir / "spec.yaml")
    params, _, _ = version_weights(spec, version)
    tokens = np.random.default_rng(0).integers(0, 32, size=(2, 12))
    expected = jax.jit(forward_fn(spec.model))(params, tokens, np.broadcast_to(np.arange(12), (2, 12)),
                                               np.ones((2, 12), np.int32))
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        logits = model(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-5)
    return True
