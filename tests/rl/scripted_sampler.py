"""A Sampler whose responses come from a script, scored by the real policy (the loop tests' one double).

The loop tests need programs with known run times (to make samples go stale on purpose), which a
tiny random model cannot write. Everything else stays real: the responses are tokenized with the
run's tokenizer, their behaviour logprobs are the current policy's log-softmax at each response
token (teacher forcing, the same quantity a sampler returns), and `sync` takes the learner's params.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mle_jax.sampling.protocol import Completion


class ScriptedSampler:
    """script: the responses in turn (cycled), or a function of the prompt's decoded text (a policy that reacts to
    what it is shown: the episode tests' "fixes the error only when the error is in its prompt")."""

    def __init__(self, model: Any, tokenizer: Any, script: Sequence[str] | Callable[[str], str]):
        self.graphdef, self.state = nnx.split(model)
        self.tokenizer = tokenizer
        self.version = 0
        self._respond = script if callable(script) else None
        self._script = None if callable(script) else itertools.cycle(script)
        self.prompts_seen: list[list[int]] = []

        @jax.jit
        def token_logprobs(state, tokens, temperature):
            logits = nnx.merge(self.graphdef, state)(tokens)
            lp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32) / temperature, axis=-1)
            return jnp.take_along_axis(lp, tokens[:, 1:, None], axis=-1)[..., 0]

        self._token_logprobs = token_logprobs

    def sync(self, params: Any, version: int) -> None:
        model = nnx.merge(self.graphdef, self.state)
        nnx.update(model, params)
        self.graphdef, self.state = nnx.split(model)
        self.version = int(version)

    def generate(self, prompts, n=1, temperature=1.0, top_p=1.0, max_tokens=256, top_k=-1, seed=None):
        out = []
        for p in prompts:
            self.prompts_seen.append(list(p))
            shown = self.tokenizer.decode(list(p)) if self._respond else ""
            for _ in range(n):
                text = self._respond(shown) if self._respond else next(self._script)
                ids = self.tokenizer.encode(text, add_special_tokens=False)[: max_tokens - 1]
                ids = ids + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
                full = np.asarray([list(p) + ids], np.int32)
                lp = np.asarray(self._token_logprobs(self.state, full, max(temperature, 1e-6)))[0, len(p) - 1 :]
                out.append(
                    Completion(
                        np.asarray(p, np.int32),
                        np.asarray(ids, np.int32),
                        lp.astype(np.float32),
                        text,
                        "stop",
                        self.version,
                    )
                )
        return out
