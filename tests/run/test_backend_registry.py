"""A new sandbox backend or sampler is one module plus one registry line: a throwaway of each kind, written to
tmp_path and registered with the registry's `register`, goes through the run's settings, preflight and builders as
the shipped ones do; an unknown name fails in one line listing the registered ones."""

from __future__ import annotations

import sys

import pytest

from configs import pizza
from mle_jax.executor import registry as sandboxes
from mle_jax.executor.sandbox import make_sandbox
from mle_jax.infra.class_registry import ClassRegistry
from mle_jax.run import builders, preflight
from mle_jax.run.settings import ConfigError, from_config
from mle_jax.sampling import registry as samplers

MODULE = "throwaway_backends"
SOURCE = """
class EchoSandbox:
    name = "echo"

    def __init__(self, image, work_root=None, out_root=None, keep_work=False):
        self.image, self.work_root = image, work_root

    @classmethod
    def options(cls, settings):
        return {"image": settings.image}

    @classmethod
    def preflight(cls, settings):
        return [f"executor.backend=echo: no echo chamber for {settings.image}"]

    def run(self, code, task, limits):
        raise NotImplementedError


class EchoSampler:
    name = "echo"
    version = 0

    def __init__(self, model, url, frozen):
        self.model, self.url, self.frozen = model, url, frozen

    @classmethod
    def from_settings(cls, settings, model, tokenizer, workdir, url=None, frozen=False):
        return cls(model, settings.vllm_url if url is None else url, frozen)

    @classmethod
    def preflight(cls, settings, instrumenter_url):
        return [f"sampler.backend=echo: nothing echoes at {settings.vllm_url} or {instrumenter_url}"]

    @classmethod
    def memory(cls, settings, samplers, device_memory_gib, decode_gib):
        return {"gib": float(samplers), "method": "1 GiB each"}

    def generate(self, prompts, n=1, **knobs):
        return []

    def sync(self, params, version):
        self.version = version
"""


@pytest.fixture
def echo(tmp_path, monkeypatch):
    """The module of the throwaway backends on sys.path, each registered as "echo"; all undone afterwards."""
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sandboxes.register("echo", f"{MODULE}:EchoSandbox")
    samplers.register("echo", f"{MODULE}:EchoSampler")
    yield
    sandboxes.unregister("echo")
    samplers.unregister("echo")
    sys.modules.pop(MODULE, None)


def _cpu_config(tmp_path, **sections):
    cfg = pizza.get_config("cpu")
    cfg.workdir = str(tmp_path / "run")
    for key, value in sections.items():
        section, field = key.split("__")
        cfg[section][field] = value
    return cfg


def _preflight_lines(settings) -> list[str]:
    with pytest.raises(preflight.PreflightError) as e:
        preflight.check(settings)
    return str(e.value).splitlines()


def test_a_registered_sandbox_goes_through_settings_preflight_and_make_sandbox(echo, tmp_path):
    s = from_config(_cpu_config(tmp_path, executor__backend="echo", executor__image="img:1"))
    assert MODULE not in sys.modules  # the settings check the name, they do not load the backend
    assert "executor.backend=echo: no echo chamber for img:1" in _preflight_lines(s)
    sandbox = make_sandbox(s.executor, work_root=tmp_path / "w")
    assert type(sandbox).__module__ == MODULE and type(sandbox).__name__ == "EchoSandbox"
    assert sandbox.image == "img:1" and sandbox.work_root == tmp_path / "w"


def test_a_registered_sampler_goes_through_settings_preflight_and_the_builders(echo, tmp_path):
    cfg = _cpu_config(tmp_path, sampler__backend="echo", sampler__vllm_url="http://127.0.0.1:9", instrument__mode="lm")
    cfg.instrument.vllm_url = "http://127.0.0.1:10"
    s = from_config(cfg)
    assert MODULE not in sys.modules
    says = "sampler.backend=echo: nothing echoes at http://127.0.0.1:9 or http://127.0.0.1:10"
    assert says in _preflight_lines(s)
    policy = object()
    sampler = builders.make_sampler(s.sampler, policy, None, tmp_path)
    assert type(sampler).__name__ == "EchoSampler" and sampler.model is policy
    assert (sampler.url, sampler.frozen) == ("http://127.0.0.1:9", False)
    instrumenter = builders.make_sampler(s.sampler, policy, None, tmp_path, url=s.instrument.vllm_url, frozen=True)
    assert (instrumenter.url, instrumenter.frozen) == ("http://127.0.0.1:10", True)


@pytest.mark.parametrize(
    "section, says",
    [("executor", "executor.backend='kvm' is unknown: use one of bwrap, docker, echo"),
     ("sampler", "sampler.backend='kvm' is unknown: use one of jax, vllm, echo")],
)  # fmt: skip
def test_an_unknown_backend_is_one_line_listing_the_registered_ones(echo, tmp_path, section, says):
    with pytest.raises(ConfigError) as e:
        from_config(_cpu_config(tmp_path, **{f"{section}__backend": "kvm"}))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_registry_refuses_bad_entries_and_a_class_under_another_name():
    reg = ClassRegistry("executor.backend", {"bwrap": "mle_jax.executor.bwrap:BwrapSandbox"})
    with pytest.raises(ValueError, match="is not an import path"):
        reg.register("x", "mle_jax.executor.bwrap.BwrapSandbox")
    with pytest.raises(ValueError, match="registered already"):
        reg.register("bwrap", "mle_jax.executor.docker:DockerSandbox")
    reg.register("podman", "mle_jax.executor.docker:DockerSandbox")
    assert reg.names() == ("bwrap", "podman")
    with pytest.raises(TypeError, match="registered as executor.backend='podman' but its name is 'docker'"):
        reg.resolve("podman")
    assert reg.resolve("bwrap").name == "bwrap"
