"""The run config is read in one place (mle_jax.run.settings): every task config becomes typed settings, an unknown
field is an error naming it, and the settings' own defaults are the config's (they cannot drift apart)."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

from configs import base, pizza
from mle_jax.env.settings import EvalSettings
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.infra.optim import OptimSettings
from mle_jax.instrument import InstrumentSettings
from mle_jax.models.settings import ModelSettings
from mle_jax.reporting.report import ReportSettings
from mle_jax.rl.settings import LearnerSettings, LoopSettings, PPOSettings
from mle_jax.run.settings import ConfigError, RunSettings, SamplerSettings, from_config
from mle_jax.sampling.protocol import SamplingSettings
from mle_jax.tasks.prompts import PromptSettings
from mle_jax.tasks.reward import RewardSettings
from mle_jax.warmstart.settings import WarmStartSettings

CONFIGS = sorted(
    p.stem for p in (Path(__file__).resolve().parents[2] / "configs").glob("*.py") if p.stem not in ("__init__", "base")
)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_task_config_becomes_settings(name):
    mod = importlib.import_module(f"configs.{name}")
    for arg in ("paper", "cpu", "smol"):
        s = from_config(mod.get_config(arg))
        assert isinstance(s, RunSettings) and s.task.id == mod.get_config(arg).task.id


def test_settings_carry_the_config_values():
    cfg = pizza.get_config("cpu")
    cfg.ppo.clip_ratio = 0.1
    cfg.sampler.temperature = 0.9
    cfg.checkpoint.every = 3
    s = from_config(cfg)
    assert s.learner.ppo.clip_ratio == 0.1 and s.learner.ppo.temperature == 0.9  # the learner's logprobs
    assert s.rollout.sampling.temperature == 0.9 and s.loop.checkpoint_every == 3
    assert s.rollout.limits.timeout_s == cfg.executor.timeout_s and s.executor.slots == cfg.executor.slots
    assert s.warmstart.model == s.model and s.warmstart.prompt == s.rollout.prompt
    assert s.loop.seed == s.learner.seed == s.eval.seed == cfg.seed


def test_an_unknown_field_or_bad_value_is_one_line_naming_it():
    cfg = pizza.get_config("cpu")
    cfg.loop.stepz = 3
    with pytest.raises(ConfigError, match=r"loop\.stepz") as e:
        from_config(cfg)
    assert "\n" not in str(e.value)
    cfg = pizza.get_config("cpu")
    cfg.ppo.loss_agg = "sum"
    with pytest.raises(ConfigError, match="loss_agg"):
        from_config(cfg)
    cfg = pizza.get_config("cpu")
    cfg.extra = 1
    with pytest.raises(ConfigError, match="extra"):
        from_config(cfg)
    cfg = pizza.get_config("cpu")
    cfg.instrument.decoding = "beam"
    with pytest.raises(ConfigError, match="decoding"):
        from_config(cfg)
    cfg = pizza.get_config("cpu")
    cfg.report.samples_mb = -1.0
    with pytest.raises(ConfigError, match=r"report\.samples_mb must be >= 0") as e:
        from_config(cfg)
    assert "\n" not in str(e.value)


def test_group_size_reaches_the_loop_and_must_divide_the_batch():
    cfg = pizza.get_config("cpu")  # B = 8
    cfg.sampler.group_size = 4
    assert from_config(cfg).loop.group_size == 4
    cfg.sampler.group_size = 3
    with pytest.raises(ConfigError, match=r"loop.batch_size B=8 is not a multiple of sampler.group_size n=3") as e:
        from_config(cfg)
    assert "\n" not in str(e.value)
    cfg.sampler.group_size = 0
    with pytest.raises(ConfigError, match="sampler.group_size must be >= 1"):
        from_config(cfg)
    old = pizza.get_config("cpu").to_dict()
    del old["sampler"]["group_size"]  # a run config saved before the field existed (mle_jax.evaluate reads those)
    assert from_config(old).loop.group_size == 1


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo", "rloo"])
def test_a_group_objective_needs_groups_of_two(algorithm):
    # groups of one sample: every advantage is 0 and nothing is learnt, so the settings refuse it
    cfg = pizza.get_config("cpu")
    cfg.learner.algorithm = algorithm
    with pytest.raises(ConfigError, match=rf"^learner.algorithm: {algorithm} needs --config.sampler.group_size >= 2"):
        from_config(cfg)
    cfg.sampler.group_size = 2
    assert from_config(cfg).learner.algorithm == algorithm


def _defaults(cls) -> dict:
    """Each field's default; a nested settings dataclass (model.lora) as the dict its config section holds."""
    return {
        f.name: dataclasses.asdict(f.default) if dataclasses.is_dataclass(f.default) else f.default
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING and not isinstance(f.default, dataclasses.Field)
    }


@pytest.mark.parametrize(
    "cls, section",
    [
        (ModelSettings, "tiny_model"),
        (PPOSettings, "ppo"),
        (OptimSettings, "optim"),
        (PromptSettings, "prompt"),
        (RewardSettings, "reward"),
        (InstrumentSettings, "instrument"),
        (ExecutorSettings, "executor"),
        (LoopSettings, "loop"),
        (WarmStartSettings, "warmstart"),
        (EvalSettings, "eval"),
        (ReportSettings, "report"),
        (LearnerSettings, "learner"),
        (SamplingSettings, "sampler"),
        (SamplerSettings, "sampler"),
        (LoopSettings, "sampler"),  # group_size, sync_every and sync_source live in the sampler section
    ],
)
def test_setting_defaults_are_the_config_defaults(cls, section):
    config = (base.tiny_model() if section == "tiny_model" else base.get_config()[section]).to_dict()
    for name, default in _defaults(cls).items():
        if name in config:
            assert config[name] == default, f"{cls.__name__}.{name}: {default!r} vs configs/base.py {config[name]!r}"


def test_corpus_verification_runs_at_most_one_program_per_cpu(monkeypatch):
    """16 sandbox slots on a 2-core machine (the paper's every-program-at-once topology) must not verify 16 corpus
    programs at once: the slow ones would time out and their measured run times would be the machine's load."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    cfg = pizza.get_config("cpu")
    cfg.executor.slots = 16
    assert from_config(cfg).warmstart.verify_workers == 2
    cfg.executor.slots = 1
    assert from_config(cfg).warmstart.verify_workers == 1
    cfg.warmstart.verify_workers = 8  # set by hand: kept
    assert from_config(cfg).warmstart.verify_workers == 8


def test_the_learner_section_picks_the_objective_and_may_be_absent():
    cfg = pizza.get_config("cpu")
    assert from_config(cfg).learner.algorithm == "ppo" and from_config(cfg).learner.objective.critic
    cfg.learner.algorithm, cfg.sampler.group_size = "rloo", 2
    assert not from_config(cfg).learner.objective.critic
    cfg.learner.algorithm = "a2c"
    with pytest.raises(ConfigError) as e:
        from_config(cfg)
    assert str(e.value) == (
        "config section learner: learner.algorithm must be one of ('ppo', 'grpo', 'dr_grpo', 'rloo'), got 'a2c'"
    )
    # the config.json of a workdir written before the section existed (mle_jax.evaluate reads it): PPO
    old = {k: v for k, v in pizza.get_config("cpu").to_dict().items() if k != "learner"}
    assert from_config(old).learner.algorithm == "ppo"


def test_a_single_task_config_is_a_mix_of_one():
    from configs import pizza

    s = from_config(pizza.get_config("cpu"))
    assert [t.id for t in s.mix] == ["random-acts-of-pizza"] and s.mix_weights == (1.0,)


def test_a_mix_keeps_the_task_section_first_with_its_prepared_dir_and_normalises_the_weights():
    from configs import multitask

    cfg = multitask.get_config("cpu")
    cfg.task.id, cfg.task.prepared_dir = "spooky-author-identification", "/some/prepared"
    cfg.tasks = ("random-acts-of-pizza", "spooky-author-identification")
    cfg.task_weights = (1.0, 3.0)
    s = from_config(cfg)
    assert [t.id for t in s.mix] == ["spooky-author-identification", "random-acts-of-pizza"]
    assert s.task.id == "spooky-author-identification" and s.mix[0].prepared_dir == "/some/prepared"
    assert s.mix[1].prepared_dir == "" and s.mix[1].raw_dir == cfg.task.raw_dir
    assert s.mix_weights == (0.75, 0.25)


def test_the_sampler_servers_are_a_list_and_the_single_url_a_list_of_one():
    cfg = pizza.get_config("cpu")
    cfg.sampler.vllm_url = "http://a:1"
    assert from_config(cfg).sampler.urls == ("http://a:1",)
    cfg.sampler.vllm_urls = ("http://a:1", "http://b:2")
    assert from_config(cfg).sampler.urls == ("http://a:1", "http://b:2")
    assert SamplerSettings(vllm_urls="http://a:1, http://b:2").urls == ("http://a:1", "http://b:2")  # one string
    assert SamplerSettings(vllm_urls=("http://a:1,http://b:2",)).urls == ("http://a:1", "http://b:2")  # tpu_pod.sh's
    assert SamplerSettings(vllm_urls=["http://a:1"]).vllm_urls == ("http://a:1",)  # a saved config's JSON list
    assert SamplerSettings().urls == ()
    cfg.sampler.vllm_url = "http://c:3"
    with pytest.raises(ConfigError, match="not one of sampler.vllm_urls"):
        from_config(cfg)
    with pytest.raises(ValueError, match="twice"):
        SamplerSettings(vllm_urls=("http://a:1", "http://a:1"))


def test_the_shm_sync_source_reaches_the_sampler_and_needs_vllm():
    cfg = pizza.get_config("cpu")  # the JAX sampler
    cfg.sampler.sync_source = "shm"
    with pytest.raises(ConfigError, match="sync_source=shm needs sampler.backend=vllm"):
        from_config(cfg)
    cfg.sampler.backend = "vllm"
    s = from_config(cfg)
    assert s.sampler.sync_source == s.loop.sync_source == "shm"
