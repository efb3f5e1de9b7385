"""LoRA: low-rank adapters over a frozen base, as pure functions of nested param dicts.

A target weight W (one of `TARGETS`, in our layout: inputs first, e.g. q_proj [D, Hq, Dh], o_proj [Hq, Dh, D])
trains as W + (alpha / r) · A B, with A [*in, r] and B [r, *out] (Hu et al. 2021). A starts as peft's default
(uniform in ±1/sqrt(fan_in), Kaiming's with a = sqrt(5)) and B at zero, so the adapted model starts as the base.

Adapters live in a nested dict shaped like the model's params, holding only the targets, each as
{"lora_a": A, "lora_b": B}; a leaf that is an array instead (the critic's value head) is a weight trained whole.
The learner trains only those (its optimizer state is the adapters'), and the frozen reference is the base itself
(adapters off). Two ways to put them on the base:

- `adapted(base, trainable, scale)`: what training runs. Each target becomes a `LoraWeight` (W, A, B, scale) that the
  model's `dense` computes as x W + scale · (x A) B, as peft does: the gradient reaches A and B without a [*in, *out]
  weight gradient or merged weight ever being formed (for a 0.5B model those are GBs per forward and backward).
- `merge(base, trainable, scale)`: the merged weights W + scale · A B, for the sampler, the HF export and evaluation,
  so nothing downstream knows about LoRA.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

Nested = dict[str, Any]
Array = jax.Array

# target name -> how many leading axes of its weight are inputs (the rest are outputs)
TARGETS = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2, "gate_proj": 1, "up_proj": 1, "down_proj": 1}
ADAPTER_KEYS = ("lora_a", "lora_b")


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """The `model.lora` section: rank r (0: off), alpha (the update is alpha / r · A B), which weights adapt."""

    rank: int = 0
    alpha: float = 32.0
    targets: tuple[str, ...] = tuple(TARGETS)

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(str(t) for t in self.targets))
        if int(self.rank) != self.rank or self.rank < 0:
            raise ValueError(f"model.lora.rank={self.rank!r} must be an integer >= 0 (0: no LoRA)")
        unknown = sorted(set(self.targets) - set(TARGETS))
        if unknown:
            raise ValueError(f"model.lora.targets: unknown {unknown}; choose from {list(TARGETS)}")
        if self.rank and not self.targets:
            raise ValueError("model.lora.targets is empty but model.lora.rank > 0: name the weights to adapt")
        if self.rank and not self.alpha > 0:
            raise ValueError(f"model.lora.alpha={self.alpha!r} must be > 0")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return float(self.alpha) / self.rank


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoraWeight:
    """A dense weight W [*in, *out] with its adapter: the model's matmul computes x W + scale · (x A) B (`apply`).
    It stands where the model reads a weight array (nnx.Param's value): `w[...]`, `astype`, a `reshape` to the 2-D
    [K, N] the matmul takes; a pytree, so the layer scan stacks W, A and B alike."""

    w: Array
    a: Array  # [*in, r]
    b: Array  # [r, *out]
    scale: float = dataclasses.field(metadata=dict(static=True))

    def __getitem__(self, index: Any) -> LoraWeight:
        if index is not Ellipsis:
            raise TypeError("a LoraWeight is read whole (w[...])")
        return self

    @property
    def dtype(self) -> Any:
        return self.w.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.w.shape

    def astype(self, dtype: Any) -> LoraWeight:
        return LoraWeight(self.w.astype(dtype), self.a.astype(dtype), self.b.astype(dtype), self.scale)

    def reshape(self, shape: tuple[int, ...]) -> LoraWeight:
        """To the matmul's [K, N]: W as asked, A to [K, r], B to [r, N]."""
        k, n = shape
        r = self.a.shape[-1]
        return LoraWeight(self.w.reshape(k, n), self.a.reshape(k, r), self.b.reshape(r, n), self.scale)

    def apply(self, x: Array, matmul: Any) -> Array:
        """x [M, K] -> x W + scale · (x A) B [M, N], each product by `matmul(x, w)` (the model's 2-D GEMM)."""
        return matmul(x, self.w) + self.scale * matmul(matmul(x, self.a), self.b)


def is_adapter(node: Any) -> bool:
    return isinstance(node, dict) and set(node) == set(ADAPTER_KEYS)


def delta(a: Array, b: Array, scale: float) -> Array:
    """A [*in, r], B [r, *out] -> scale · A B [*in, *out] (float32 accumulation)."""
    return scale * jnp.tensordot(a, b, axes=1, preferred_element_type=jnp.float32)


def init_adapters(base: Nested, s: LoraSettings, key: Array, dtype: Any = jnp.float32) -> Nested:
    """The adapters of every target weight in `base` (nested dict of arrays or ShapeDtypeStructs): {"lora_a": A
    [*in, r] uniform in ±1/sqrt(fan_in), "lora_b": B [r, *out] zeros}, in `dtype`. Each target's key is folded from
    its path, so the draw does not depend on which other targets are chosen."""

    def walk(node: Nested, path: tuple[str, ...]) -> Nested:
        out: Nested = {}
        for k, v in node.items():
            if isinstance(v, dict):
                sub = walk(v, (*path, k))
                if sub:
                    out[k] = sub
            elif k in s.targets:
                n_in = TARGETS[k]
                shape_in, shape_out = tuple(v.shape[:n_in]), tuple(v.shape[n_in:])
                fan_in = math.prod(shape_in)
                kk = jax.random.fold_in(key, zlib.crc32("/".join((*path, k)).encode()) % (2**31))
                bound = 1.0 / math.sqrt(fan_in)
                a = jax.random.uniform(kk, (*shape_in, s.rank), jnp.float32, -bound, bound).astype(dtype)
                out[k] = {"lora_a": a, "lora_b": jnp.zeros((s.rank, *shape_out), dtype)}
        return out

    adapters = walk(base, ())
    if not adapters:
        raise ValueError(f"model.lora.targets={list(s.targets)}: no such weight in the model")
    return adapters


def _put_on(base: Nested, trainable: Nested, adapt: Callable[[Array, Nested], Any]) -> Nested:
    """`base` with adapt(weight, adapter) at each adapter of `trainable`, each whole array of `trainable` in place of
    (or beside) the base's; keys of `trainable` absent from `base` taken as they are (the critic's head)."""
    out: Nested = {}
    for k, v in base.items():
        t = trainable.get(k)
        if t is None:
            out[k] = v
        elif is_adapter(t):
            out[k] = adapt(v, t)
        elif isinstance(t, dict):
            out[k] = _put_on(v, t, adapt)
        else:
            out[k] = t
    return out | {k: t for k, t in trainable.items() if k not in base}


def merge(base: Nested, trainable: Nested, scale: float) -> Nested:
    """The model's params with the adapters merged: W + scale · A B (in W's dtype) at each adapted weight, and the
    whole arrays of `trainable` (`_put_on`)."""
    return _put_on(
        base, trainable, lambda w, t: (w.astype(jnp.float32) + delta(t["lora_a"], t["lora_b"], scale)).astype(w.dtype)
    )


def adapted(base: Nested, trainable: Nested, scale: float) -> Nested:
    """As `merge`, but each adapted weight a `LoraWeight` (W, A, B) that the model applies unmerged (training)."""
    return _put_on(
        base, trainable, lambda w, t: LoraWeight(w, t["lora_a"].astype(w.dtype), t["lora_b"].astype(w.dtype), scale)
    )


def count(trainable: Nested) -> int:
    """Number of trained scalars in `trainable`."""
    return sum(int(math.prod(x.shape)) for x in jax.tree.leaves(trainable))
