import pytest

from configs import pizza


def test_pizza_configs_build():
    paper = pizza.get_config()
    cpu = pizza.get_config("cpu")
    assert paper.task.id == cpu.task.id == "random-acts-of-pizza"
    assert paper.ppo.clip_ratio == 0.2 and paper.ppo.gamma == 1.0 and paper.ppo.lam == 1.0
    assert paper.model.num_hidden_layers == 36 and cpu.model.num_hidden_layers < 36
    assert cpu.sampler.backend == "jax" and paper.sampler.backend == "vllm"


def test_pizza_config_rejects_unknown_arg():
    with pytest.raises(ValueError, match="unknown arg"):
        pizza.get_config("gpu-typo")
