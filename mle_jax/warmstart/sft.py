"""Supervised fine-tuning on (prompt, response) pairs: the warm-start stage before RL.

Each example is a real RL prompt for the task, rendered with the chat template and the RL budget (the
scratch prompt, or an improve prompt about a verified program, see `warmstart.improve`), followed by a
corpus response (plan + fenced program) and `<|im_end|>`. The loss is token cross entropy on the
response tokens only.

Layout of one batch row, so that every row shares one slice of response positions:

    [ pad … pad | prompt (left-padded to P) | response + <|im_end|> | pad … ]   length P + R
                                             ^ targets: tokens[:, P:P+R], predicted from h[:, P-1:P+R-1]

Only the R response positions go through the LM head (the prompt never needs logits), which is most of
the cost saved on CPU. The data stream is a grain MapDataset (shuffle by seed, repeated, batched) whose
iterator state is checkpointed with orbax next to the params and optimizer state: a resumed SFT
continues the same stream of batches.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from mle_jax.infra import interrupt
from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.infra.optim import make_optimizer
from mle_jax.models.tokenizer import train_bpe_tokenizer
from mle_jax.tasks.prompts import render_prompt
from mle_jax.warmstart.settings import SFTSettings

Messages = list[dict[str, str]]
RenderFn = Callable[[Messages, Any, int], list[int]]


def default_render(messages: Messages, tokenizer: Any, max_tokens: int) -> list[int]:
    """The RL loop's own prompt renderer (chat template + generation prompt, truncated to max_tokens). A prompt that
    renders itself (`render_ids(tokenizer, max_tokens)`: a later turn of a conversation, warmstart/debug.py, whose
    tokens the RL loop builds by appending, not by rendering one chat) does so."""
    render_ids = getattr(messages, "render_ids", None)
    if render_ids is not None:
        return list(render_ids(tokenizer, max_tokens))
    return list(render_prompt(messages, tokenizer, max_tokens))


def end_of_turn_id(tokenizer: Any) -> int:
    """The id of `<|im_end|>` (the sampler's stop token) in a ChatML tokenizer."""
    tid = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if tid is None or tid == tokenizer.unk_token_id:
        raise ValueError("tokenizer has no <|im_end|> token: warm start needs a ChatML tokenizer")
    return int(tid)


# ------------------------------------------------------------------------------------------------ data


def train_task_tokenizer(
    responses: Sequence[str],
    prompts: Sequence[Messages],
    vocab_size: int,
    out_dir: str | Path,
    max_token_length: int | None = 16,
) -> Any:
    """The tokenizer of a run without a checkpoint: a byte-level BPE trained on the task's warm-start
    responses (plans + programs) and its prompt chats (message texts and role names), saved to out_dir.

    With `max_token_length` set, merges may cross spaces and punctuation up to that many characters
    (see `mle_jax.models.tokenizer.train_bpe_tokenizer`): a corpus program is then ~135 tokens instead
    of ~450, which is what lets a tiny model learn to write whole programs in a few CPU minutes.
    `max_token_length=None` gives the word-level tokenizer.
    """
    if not responses:
        raise ValueError("train_task_tokenizer needs at least one response text")
    texts = list(responses)
    for messages in prompts:
        texts += [m["content"] for m in messages]
        texts += ["\n".join(m["role"] for m in messages) + "\nassistant\n"]
    return train_bpe_tokenizer(texts, vocab_size, out_dir, max_token_length)


def pack_examples(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int, multiple: int = 32
) -> dict[str, np.ndarray]:
    """Token lists -> fixed-shape arrays (one jit shape for the whole run).

    prompts[i] is left-padded to P = max prompt length; responses[i] right-padded to R (max response
    length rounded up to `multiple`). Returns tokens [N, P+R] int32, attention_mask [N, P+R] bool,
    loss_mask [N, R] float32 (1 on real response tokens), and prompt_len P (a 0-d array).
    """
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"need as many prompts as responses (>0), got {len(prompts)} and {len(responses)}")
    p = max(len(x) for x in prompts)
    r = -(-max(len(x) for x in responses) // multiple) * multiple
    n = len(prompts)
    tokens = np.full((n, p + r), pad_id, np.int32)
    attn = np.zeros((n, p + r), bool)
    loss_mask = np.zeros((n, r), np.float32)
    for i, (pr, rs) in enumerate(zip(prompts, responses, strict=True)):
        if not rs:
            raise ValueError(f"example {i} has an empty response")
        tokens[i, p - len(pr) : p] = pr
        tokens[i, p : p + len(rs)] = rs
        attn[i, p - len(pr) : p + len(rs)] = True
        loss_mask[i, : len(rs)] = 1.0
    return {"tokens": tokens, "attention_mask": attn, "loss_mask": loss_mask, "prompt_len": np.asarray(p)}


def tokenize_examples(
    examples: Sequence[tuple[Messages, str]],
    tokenizer: Any,
    max_prompt_tokens: int,
    max_response_tokens: int,
    render_fn: RenderFn | None = None,
) -> tuple[list[list[int]], list[list[int]], int]:
    """(prompt messages, response text) pairs -> prompt ids, response ids (+ <|im_end|>), #dropped.

    Responses longer than max_response_tokens are dropped (a truncated program teaches broken code).
    """
    render = render_fn or default_render
    eot = end_of_turn_id(tokenizer)
    prompt_cache: dict[str, list[int]] = {}
    prompts, responses, dropped = [], [], 0
    for messages, response in examples:
        key = json.dumps(messages, sort_keys=True)
        if key not in prompt_cache:
            prompt_cache[key] = render(messages, tokenizer, max_prompt_tokens)
        ids = list(tokenizer.encode(response, add_special_tokens=False)) + [eot]
        if len(ids) > max_response_tokens:
            dropped += 1
            continue
        prompts.append(prompt_cache[key])
        responses.append(ids)
    if not responses:
        raise ValueError(f"every response is longer than max_response_tokens={max_response_tokens}")
    return prompts, responses, dropped


def batch_stream(n: int, batch_size: int, seed: int) -> grain.IterDataset:
    """Indices 0..n-1, shuffled by `seed` (a new permutation each epoch), repeated forever, batched: [batch_size]
    int arrays. Read in the caller's thread, one batch when asked: grain's default read options prefetch with 16
    threads, which kept computing ~500 batches ahead of the last one asked for (~3 s of CPU per stream, spent after
    a short SFT had ended)."""
    ds = grain.MapDataset.range(n).shuffle(seed=seed).repeat(None).batch(batch_size, drop_remainder=True)
    return ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))


# ------------------------------------------------------------------------------------------------ math


def response_loss(logits: jax.Array, targets: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Mean token cross entropy over the response.

    logits [B, R, V] float32 (position j predicts targets[:, j]), targets [B, R] int32,
    loss_mask [B, R] (1 = response token) -> scalar.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return (nll * loss_mask).sum() / jnp.maximum(loss_mask.sum(), 1.0)


def make_train_step(
    graphdef: Any, rest: Any, tx: optax.GradientTransformation, prompt_len: int, micro_batch_size: int = 0
) -> Callable:
    """(params, opt_state, batch) -> (params, opt_state, loss): one jitted, pure update.

    micro_batch_size m > 0 runs the forward+backward on m rows at a time (a scan over B/m micro-batches) and sums
    their token losses and gradients, normalised by the whole batch's response tokens: the same loss and gradient
    as the whole batch at once (up to float summation order), with activations of m rows.
    """

    def nll_sum(params, batch):
        model = nnx.merge(graphdef, params, rest)
        r = batch["loss_mask"].shape[1]
        h, _ = model.hidden_states(batch["tokens"], None, batch["attention_mask"])
        logits = model.logits_from_hidden(h[:, prompt_len - 1 : prompt_len - 1 + r])
        targets = batch["tokens"][:, prompt_len : prompt_len + r]
        return response_loss(logits, targets, batch["loss_mask"]) * jnp.maximum(batch["loss_mask"].sum(), 1.0)

    @jax.jit
    def step(params, opt_state, batch):
        b = batch["tokens"].shape[0]
        m = micro_batch_size or b
        if b % m:
            raise ValueError(f"micro_batch_size {m} does not divide the batch of {b}")
        micro = jax.tree.map(lambda x: x.reshape(b // m, m, *x.shape[1:]), batch)

        def accumulate(carry, mb):
            total, grads = carry
            s, g = jax.value_and_grad(nll_sum)(params, mb)
            return (total + s, jax.tree.map(jnp.add, grads, g)), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        (total, grads), _ = jax.lax.scan(accumulate, (jnp.zeros((), jnp.float32), zeros), micro)
        denom = jnp.maximum(batch["loss_mask"].sum(), 1.0)
        loss, grads = total / denom, jax.tree.map(lambda g: g / denom, grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def copy_pretrain(
    model: nnx.Module,
    vocab_size: int,
    steps: int,
    length: int = 96,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    first_id: int = 3,
) -> list[float]:
    """Trains `model` in place to repeat random token sequences ([a_1..a_n, SEP, a_1..a_n] with n = `length`,
    loss on the repeat); returns the loss every 50 steps.

    A tiny model trained from scratch learns the task's programs but not to copy: asked to instrument a
    program it writes back the grid's typical program with typical values. Random sequences can only be
    predicted by copying, so a few hundred steps form the attention circuit that copies (induction heads;
    measured: the loss falls from 7.6 to < 0.05 within 150 steps at n = 48 or 96 on the tiny model, while
    lengths drawn anew each step had not learned by step 250); the instrumentation SFT that follows then
    learns to use it. Token ids below `first_id` (the special tokens) are not drawn; SEP is the last of them.
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(lr, grad_clip=1.0, warmup_steps=min(20, steps // 10), decay_steps=steps)
    opt_state = tx.init(params)
    step = make_train_step(graphdef, rest, tx, length + 1)
    rng = np.random.default_rng(seed)
    losses = []
    for i in range(steps):
        seq = rng.integers(first_id, vocab_size, size=(batch_size, length))
        tokens = np.concatenate([seq, np.full((batch_size, 1), first_id - 1), seq], axis=1).astype(np.int32)
        batch = {
            "tokens": jnp.asarray(tokens),
            "attention_mask": jnp.ones(tokens.shape, jnp.int32),
            "loss_mask": jnp.ones((batch_size, length), jnp.float32),
        }
        params, opt_state, loss = step(params, opt_state, batch)
        if i % 50 == 0 or i == steps - 1:
            losses.append(float(loss))
    nnx.update(model, params)
    return losses


# ------------------------------------------------------------------------------------------------ run


def run_sft(
    model: nnx.Module,
    tokenizer: Any,
    examples: Sequence[tuple[Messages, str]],
    settings: SFTSettings,
    workdir: str | Path,
    render_fn: RenderFn | None = None,
    progress: bool = True,
    stop_at: int | None = None,
) -> dict[str, Any]:
    """Fine-tunes `model` in place on the response tokens of `examples`; resumable.

    The optimizer is AdamW with a linear warmup then cosine decay to 10% of lr over `settings.steps`.
    stop_at: checkpoint and return after this step (a planned pre-emption; the schedule still spans
    settings.steps, so a later call resumes exactly where this one stopped).
    workdir gets `sft_ckpt/` (a `Checkpointer`: params, optimizer state, grain iterator state) and
    `sft_metrics.jsonl` (one line per logged step). A workdir holding a checkpoint resumes from it.
    Returns {"steps", "first_loss", "final_loss", "wall_s", "examples", "dropped", "prompt_len",
    "response_len", "resumed_from"}.
    """
    steps, bs, seed = settings.steps, settings.batch_size, settings.seed
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    prompts, responses, dropped = tokenize_examples(
        examples, tokenizer, settings.max_prompt_tokens, settings.max_response_tokens, render_fn
    )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_of_turn_id(tokenizer)
    data = pack_examples(prompts, responses, pad_id)
    n, prompt_len = len(responses), int(data["prompt_len"])
    if n < bs:
        raise ValueError(f"{n} usable examples < batch_size {bs}")

    tx = make_optimizer(
        settings.lr,
        grad_clip=settings.grad_clip,
        weight_decay=settings.weight_decay,
        warmup_steps=settings.warmup_steps,
        decay_steps=steps,
    )
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt_state = tx.init(params)
    stream = iter(batch_stream(n, bs, seed))

    ckpt = Checkpointer(workdir / "sft_ckpt", keep=2, async_save=False)
    start, resumed_from = 0, None
    found = ckpt.restore_latest({"state": {"params": params, "opt_state": opt_state}})
    if found is not None:
        resumed_from, restored = found
        start = resumed_from
        params, opt_state = restored["state"]["params"], restored["state"]["opt_state"]
        stream.set_state(restored["data_iter"])

    def save(step: int) -> None:
        ckpt.save(
            step, {"state": {"params": params, "opt_state": opt_state}, "data_iter": stream.get_state()}, force=True
        )

    train_step = make_train_step(graphdef, rest, tx, prompt_len, settings.micro_batch_size)
    metrics_path = workdir / "sft_metrics.jsonl"
    log_every, ckpt_every = settings.log_every, settings.checkpoint_every
    first_loss = final_loss = None
    last = steps if stop_at is None else max(start, min(steps, stop_at))
    t0 = time.perf_counter()
    bar = None
    if progress:
        bar = Progress(
            TextColumn("warm-start SFT"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TimeRemainingColumn(),
            transient=False,
        )
        bar.start()
        bar_task = bar.add_task("sft", total=steps, completed=start, loss="-")
    try:
        with metrics_path.open("a") as log:
            for step in range(start + 1, last + 1):
                idx = next(stream)
                batch = {k: jnp.asarray(data[k][idx]) for k in ("tokens", "attention_mask", "loss_mask")}
                params, opt_state, loss = train_step(params, opt_state, batch)
                if step == start + 1 or step % log_every == 0 or step == steps:
                    final_loss = float(loss)
                    first_loss = final_loss if first_loss is None else first_loss
                    rec = {
                        "step": step,
                        "loss": final_loss,
                        "wall_s": round(time.perf_counter() - t0, 3),
                        "response_tokens": int(batch["loss_mask"].sum()),
                    }
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
                    if bar is not None:
                        bar.update(bar_task, loss=f"{final_loss:.3f}")
                if bar is not None:
                    bar.advance(bar_task)
                if step % ckpt_every == 0 or step == last:
                    save(step)
                elif interrupt.requested():  # Ctrl-C: keep this step, then stop below
                    save(step)
                if step < last:
                    interrupt.raise_if_requested(f"stopped after warm-start SFT step {step} of {steps} (saved)")
    finally:
        if bar is not None:
            bar.stop()
        ckpt.close()
    nnx.update(model, params)
    return {
        "steps": last,
        "first_loss": first_loss,
        "final_loss": final_loss,
        "wall_s": time.perf_counter() - t0,
        "examples": n,
        "dropped": dropped,
        "prompt_len": prompt_len,
        "response_len": int(data["loss_mask"].shape[1]),
        "resumed_from": resumed_from,
    }
