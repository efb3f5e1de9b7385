import importlib
from pathlib import Path

import pytest

from configs import base, pizza
from mle_jax.run.settings import from_config

CONFIG_FILES = sorted(
    p.stem for p in (Path(__file__).resolve().parents[2] / "configs").glob("*.py") if p.stem not in ("__init__", "base")
)


def test_pizza_configs_build():
    paper = pizza.get_config()
    cpu = pizza.get_config("cpu")
    assert paper.task.id == cpu.task.id == "random-acts-of-pizza"
    assert paper.ppo.clip_ratio == 0.2 and paper.ppo.gamma == 1.0 and paper.ppo.lam == 1.0
    assert paper.model.num_hidden_layers == 36 and cpu.model.num_hidden_layers < 36
    assert cpu.sampler.backend == "jax" and paper.sampler.backend == "vllm"


def test_smol_config_is_the_embedded_run_with_smollm2():
    cpu, smol = pizza.get_config("cpu"), pizza.get_config("smol")
    assert smol.model.path == base.SMOL_DIR == "checkpoints/smollm2-135m-instruct"
    assert (smol.model.num_hidden_layers, smol.model.hidden_size, smol.model.vocab_size) == (30, 576, 49152)
    assert smol.warmstart.enabled and smol.instrument.mode == cpu.instrument.mode == "lm"
    assert (smol.instrument.decoding, cpu.instrument.decoding) == ("free", "copy")  # as docs/smollm2.md says
    assert smol.sampler.backend == cpu.sampler.backend == "jax" and smol.executor.backend == "bwrap"
    assert smol.loop.batch_size == smol.ppo.mini_batch_size == 4  # its memory is flat over a run (docs/smollm2.md)
    assert smol.prompt.max_prompt_tokens == base.get_config().prompt.max_prompt_tokens
    assert smol.workdir == "runs/random-acts-of-pizza-smol"
    assert smol.warmstart.lr < cpu.warmstart.lr and smol.warmstart.steps * smol.warmstart.batch_size <= 64


def test_qwen_config_is_the_papers_prompted_setting_on_qwen_coder():
    smol, qwen = pizza.get_config("smol"), pizza.get_config("qwen")
    assert qwen.model.path == base.QWEN_DIR == "checkpoints/qwen2.5-coder-0.5b-instruct"
    assert (qwen.model.num_hidden_layers, qwen.model.hidden_size, qwen.model.vocab_size) == (24, 896, 151936)
    assert not qwen.model.tie_word_embeddings and qwen.model.lora.rank == 16
    assert not qwen.warmstart.enabled  # prompted, as the paper's policy
    assert (qwen.instrument.mode, qwen.instrument.decoding) == ("lm", "free")
    assert qwen.prompt.max_prompt_tokens == qwen.sampler.max_tokens == base.get_config().sampler.max_tokens == 1024
    assert qwen.optim.actor_lr == base.get_config().optim.actor_lr
    assert qwen.sampler.backend == smol.sampler.backend == "jax" and qwen.executor.backend == "bwrap"
    assert qwen.workdir == "runs/random-acts-of-pizza-qwen"
    s = from_config(qwen)
    assert s.learner.lora == s.model.lora and s.learner.lora.scale == 2.0


def test_paper_numbers_in_base_config():
    c = base.get_config()
    assert (c.loop.batch_size, c.ppo.mini_batch_size, c.ppo.micro_batch_size) == (128, 128, 8)
    assert c.optim.actor_lr == c.optim.critic_lr == 1e-5
    assert (c.ppo.value_clip, c.ppo.entropy_coef, c.ppo.kl_coef, c.optim.grad_clip) == (0.5, 0.001, 0.001, 1.0)
    assert (c.sampler.temperature, c.sampler.top_p) == (0.7, 1.0)
    assert c.prompt.max_prompt_tokens == c.sampler.max_tokens == 1024
    assert c.prompt.improve_fraction == 0.5 and c.ppo.duration_weights == "batch_mean"
    assert (c.reward.failure, c.reward.per_print) == (-10.0, 0.1)


def test_every_task_has_a_config_with_a_known_task_id():
    from mle_jax.tasks import registry

    ids = set()
    for name in CONFIG_FILES:
        mod = importlib.import_module(f"configs.{name}")
        for arg in ("paper", "cpu", "smol", "qwen"):
            c = mod.get_config(arg)
            registry.get_spec(c.task.id)  # raises for an unknown id
            ids.add(c.task.id)
    assert len(ids) == 12


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_config_rejects_unknown_arg(name):
    mod = importlib.import_module(f"configs.{name}")
    with pytest.raises(ValueError, match="unknown"):
        mod.get_config("gpu-typo")
