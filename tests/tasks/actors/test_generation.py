"""The generation service's warm-up: the engine's shapes compiled on its own thread before
any episode starts, so that no episode's clock pays for a compile (README, "Actors")."""

import asyncio
import logging
import threading

import jax
import pytest

from learner.chat import make_tokenizer
from learner.config import ModelConfig, TokenizerConfig
from learner.model import init_params
from tasks.actors.generation import GenerationService, make_engine, use_compile_cache
from tasks.actors.rollout import GroupRunner
from tasks.config import ActorsConfig, EnvConfig
from tests.tasks.actors.test_rollout import Countdown

MODEL = ModelConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_len=16,
                    tokenizer=TokenizerConfig(alphabet="abc:!"))
ACTORS = ActorsConfig(slots=2, max_new_tokens=2)


@pytest.fixture
def service():
    service = GenerationService(make_engine(MODEL, ACTORS)).start()
    yield service
    service.stop()


def test_once_warmed_up_a_group_of_episodes_compiles_nothing(service, caplog):
    service.load(0, jax.device_get(init_params(MODEL, 0)))
    waiting = []  # a second caller (another actor task of the process) waits for the same warm-up
    second = threading.Thread(target=lambda: waiting.append(service.warm_up(2)))
    with caplog.at_level(logging.INFO, logger="tasks.actors.generation"):
        second.start()
        seconds = service.warm_up(2)
        second.join(60)
        assert service.warm_up(2) == seconds == waiting[0] > 0
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [f"engine compiled in {seconds:.1f}s"]
    warmed = service.engine.compiles
    assert warmed == {"prefill": 2, "suffix": 8, "decode": 1}  # K in {1, 2}; P 16, and 2, 4, 8, 16

    runner = GroupRunner(service.generate, service.release, make_tokenizer(MODEL),
                         EnvConfig(max_turns=3, episode_timeout_s=30.0), ACTORS, MODEL.max_len)

    # Each: first turns of whole contexts, then suffixes (each episode keeps its slot), 1 or 2 rows at once.
    groups = [asyncio.run(runner.run(i, "p", 0, [Countdown(3), Countdown(2)])) for i in range(2)]
    assert [g.aborted for g in groups] == [None, None]
    assert service.engine.admitted["suffix"] >= 4 and service.engine.compiles == warmed


def test_a_warm_up_waits_for_the_first_weights(service):
    """Asked before any weights were handed over (a follower still fetching), it runs once they are."""
    done = []
    waiting = threading.Thread(target=lambda: done.append(service.warm_up(1)))
    waiting.start()
    waiting.join(1.0)
    assert waiting.is_alive() and not done
    service.load(0, jax.device_get(init_params(MODEL, 0)))
    waiting.join(120)
    assert done and service.engine.compiles["decode"] == 1


@pytest.fixture
def jax_cache_config():
    saved = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
    yield
    jax.config.update("jax_compilation_cache_dir", saved[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])


def test_engine_processes_keep_their_compiles_in_tandems_home(tmp_path, monkeypatch, jax_cache_config):
    """A resume, an eval or the next run on this machine loads the engine's shapes."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    jax.config.update("jax_compilation_cache_dir", None)
    use_compile_cache()
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jax-cache")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    jax.config.update("jax_compilation_cache_dir", "/elsewhere")  # JAX_COMPILATION_CACHE_DIR: the user's
    use_compile_cache()
    assert jax.config.jax_compilation_cache_dir == "/elsewhere"
