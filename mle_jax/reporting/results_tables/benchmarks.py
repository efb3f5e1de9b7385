"""The benchmarks table (one row per benchmark, with the command that measured it) and the objectives' update step
(bench/objective_step.py)."""

from __future__ import annotations

from mle_jax.infra.op_profile import category
from mle_jax.reporting.markdown import markdown_table, number
from mle_jax.reporting.results_tables.duration_bias import bias_record
from mle_jax.reporting.results_tables.sources import RESULTS


def render_benchmarks(bias: list[dict], epochs: dict, hostile: dict) -> str:
    """The benchmarks whose figures are in docs/results, with the command that measured each."""
    sgd = bias_record(bias, {}, 0)
    ep = epochs["epochs"]
    clip = " / ".join(f"{ep[k]['outside_clip']:.1%}" for k in ep)
    valid = " / ".join(number(ep[k]["valid_fraction_after"]) for k in ep)
    rows = [
        [
            "duration bias (simulated, plain SGD, 2 epochs): final P(fast) without weights / P(slow) with Δt weights",
            f"{number(sgd['final']['off']['probs']['fast'], 3)} / "
            f"{number(sgd['final']['batch_mean']['probs']['slow'], 3)}",
            f"`{sgd['command']}` ([{RESULTS}/duration_bias.jsonl]({RESULTS}/duration_bias.jsonl))",
        ],
        [
            f"PPO epochs over one real batch of {epochs['batch']['size']} (warm-started pizza policy): tokens outside"
            f" the clip range after the update, {' / '.join(ep)} epochs; valid fraction of fresh samples (before:"
            f" {number(epochs['before']['valid_fraction'])})",
            f"{clip}; {valid}",
            f"`{epochs.get('command', 'python -m mle_jax.experiments.ppo_epochs')}` ([{RESULTS}/ppo_epochs.json]"
            f"({RESULTS}/ppo_epochs.json))",
        ],
    ]
    grade, run = hostile["results"]["grade"], hostile["results"]["executor"]
    wide, files = grade["header of 10^6 extra fields"], run["220,000 empty files then 800 MB, --work-mb 300"]
    rows.append(
        [
            "hostile inputs beside a normal peer in the same run: a 10^6-field header (7.9 MB) through the grade CLI "
            "(refused in one line); a program making 220,000 empty files, then writing 800 MB, under --work-mb 300",
            f"{wide['wall_s']} s and {wide['peak_rss_mb']:.0f} MB ({wide['wall_vs_peer']}x / {wide['rss_vs_peer']}x "
            f"the peer's); {'killed for disk' if files['output'].get('killed_reason') == 'disk' else files['output']}"
            f" after {files['wall_s']:.0f} s",
            f"`{hostile['command']}` ([{RESULTS}/hostile_inputs.json]({RESULTS}/hostile_inputs.json))",
        ]
    )
    return markdown_table(["what", "measured", "reproduce (results file)"], rows)


def render_hostile_inputs(hostile: dict) -> str:
    """bench/hostile_inputs.py's executor programs, each beside the normal peer measured in the same run: its time
    and peak memory (and their ratios to the peer's), its status and what became of its submission."""
    rows = []
    for name, r in hostile["results"]["executor"].items():
        out = r["output"]
        status = out["status"] + (f" ({out['killed_reason']})" if out.get("killed_reason") else "")
        outcome = "; ".join(f"{n}x {o}" for o, n in r["outcomes"].items()) if "outcomes" in r else None
        graded = outcome or ("valid" if out["submission_valid"] else out["grade_reason"])
        rows.append([name, f"{r['wall_s']:.2f} s", f"{r['peak_rss_mb']:.0f} MB",
                     f"{r['wall_vs_peer']}x / {r['rss_vs_peer']}x", status, graded])  # fmt: skip
    header = ["program (bwrap, through `python -m mle_jax.executor run`)", "wall", "peak memory",
              "time / memory vs the peer", "status", "submission"]  # fmt: skip
    return markdown_table(header, rows) + f"\n\nFrom `{hostile['command']}` ({hostile['date'][:10]})."


def render_objective_step(d: dict) -> str:
    """bench/objective_step.py's file: each objective's update on one batch (its own process), against the first."""
    peer = next(iter(d["results"]))
    rows = []
    for name, r in d["results"].items():
        ratio = r["step_s"] / d["results"][peer]["step_s"]
        rows.append([f"`{name}`", f"{r['step_s']:.2f} s", f"{d['batch'] * d['seq'] / r['step_s']:.0f}",
                     number(r["peak_gib"], 1), f"{ratio:.2f}"])  # fmt: skip
    header = [f"objective ({d['device']}, {d['shape']} shape with {d['layers']} layers, {d['dtype']}, "
              f"{d['batch']} x {d['seq']} tokens, micro-batch {d['micro_batch']}, groups of {d['group']})",
              "update step", "tokens / s", "peak device GiB", f"step time / `{peer}`'s"]  # fmt: skip
    return markdown_table(header, rows) + f"\n\nFrom `{d['command']}` ({d['date'][:10]})."


def render_micro_sweep(*files: dict) -> str:
    """bench/objective_step.py's files of one objective at several micro-batch sizes (and remat settings), each its own
    process, same device, batch and layers: step time, tokens/s, the policy's TFLOP/s by 6·N·tokens and its share of
    the device's nominal dense bf16 peak (MFU), peak memory, and step time against the first file's."""
    peer = next(iter(files[0]["results"].values()))["step_s"]
    rows = []
    for d in files:
        for name, r in d["results"].items():
            rows.append([f"`{name}`", d["micro_batch"], "on" if d.get("remat", True) else "off", f"{r['step_s']:.3f} s",
                         f"{d['batch'] * d['seq'] / r['step_s']:.0f}", f"{r['policy_tflops_6n']:.0f}",
                         f"{r['mfu_6n']:.1%}", number(r["peak_gib"], 1), f"{r['step_s'] / peer:.2f}"])  # fmt: skip
    d = files[0]
    header = [f"objective ({d['device']}, {d['shape']} shape, {d['layers']} layers, {d['batch']} x {d['seq']} tokens)",
              "micro-batch", "remat", "update step", "tokens / s", "TFLOP/s (6·N·tokens)",
              f"MFU of {d['peak_tflops']:.0f} TFLOP/s", "peak device GiB", "step time / first row's"]  # fmt: skip
    commands = "; ".join(f"`{f['command']}`" for f in files)
    return markdown_table(header, rows) + f"\n\nFrom {commands} ({d['date'][:10]})."


def _device_time(profile: dict) -> dict[str, float]:
    """A profile's device milliseconds by category, the costliest ops re-labelled by today's categories (a file's
    own split may predate one: cuBLAS's `nvjet` kernels were "other" before they were "matmul")."""
    cats = dict(profile["by_category"])
    for op in profile["top"]:
        now = category(op["name"], op.get("hlo", ""))
        if now != op["category"]:
            cats[op["category"]] = cats.get(op["category"], 0.0) - op["ms"]
            cats[now] = cats.get(now, 0.0) + op["ms"]
    return cats


def _device_shares(r: dict) -> list[str]:
    """One result's device time (where it has `--profile`'s trace) as shares of the busy time: matmuls, cuDNN
    attention, fusions, copies and the rest; dashes without a trace."""
    if "profile" not in r:
        return ["—"] * 4
    cats, busy = _device_time(r["profile"]), r["profile"]["busy_ms"]
    groups = (("matmul",), ("attention (cuDNN)",), ("fusion (elementwise, reduce)",),
              ("copy / transpose", "collective", "other"))  # fmt: skip
    return [f"{sum(cats.get(k, 0.0) for k in keys) / busy:.0%}" for keys in groups]


def render_step_profile(variants: dict[str, str], *files: dict) -> str:
    """bench/objective_step.py's files of code variants of one update on one device (`variants`: each file's label, in
    order): step time, MFU by 6·N·tokens, peak memory, compile time and, where the file has `--profile`'s trace,
    where the device's time went."""
    labels = list(variants.values())
    rows = []
    for label, d in zip(labels, files, strict=True):
        name, r = next(iter(d["results"].items()))
        rows.append([label, f"`{name}`", d["micro_batch"], "on" if d["remat"] else "off", f"{r['step_s']:.3f} s",
                     f"{r['mfu_6n']:.1%}", number(r["peak_gib"], 1), f"{r['compile_s']:.0f} s",
                     *_device_shares(r)])  # fmt: skip
    d = files[0]
    header = [f"code ({d['device']}, {d['shape']} shape, {d['layers']} layers, {d['batch']} x {d['seq']} tokens)",
              "objective", "micro-batch", "remat", "update step", f"MFU of {d['peak_tflops']:.0f} TFLOP/s (6·N·tokens)",
              "peak device GiB", "compile + first step", "device time: matmuls", "cuDNN attention",
              "fusions (elementwise, softmax, reductions)", "copies, other"]  # fmt: skip
    commands = "; ".join(f"`{f['command']}`" for f in files)
    return markdown_table(header, rows) + f"\n\nFrom {commands} ({d['date'][:10]}; the device time from `--profile`)."


def render_mfu_sweep(variants: dict[str, tuple[int, str]], *files: dict) -> str:
    """bench/objective_step.py's files of one device's lease (`variants`: each file's call on that lease and label,
    in order): each row's settings as its file records them, step time, MFU by 6·N·tokens (the policy's training
    FLOPs, the issue's measure) and by every pass the update runs (the reference's forward, a critic's forward and
    training), peak memory, compile time, the device time's split where the file has `--profile`'s trace, and step
    time against the first row of the same call (one machine: compare rows of one call only)."""
    rows, peers = [], {}
    for (call, label), d in zip(variants.values(), files, strict=True):
        name, r = next(iter(d["results"].items()))
        peers.setdefault(call, r["step_s"])
        remat = d["remat_policy"] if d["remat"] else "off"
        # files before --scan_layers ran the 3b shape's scan
        stack = f"{d['layers']}, " + ("scan" if d.get("scan_layers", True) else "unrolled")
        logprobs = "fused" if d["fused_logprobs"] else "autodiff"
        rows.append([call, label, f"`{name}`", logprobs, remat, stack, d["logits_chunk"], f"{r['step_s']:.3f} s",
                     f"{r['mfu_6n']:.1%}", f"{r['mfu_model']:.1%}", number(r["peak_gib"], 1),
                     f"{r['compile_s']:.0f} s", *_device_shares(r), f"{r['step_s'] / peers[call]:.2f}"])  # fmt: skip
    d = files[0]
    header = ["call", f"code ({d['device']}, {d['shape']} shape, {d['batch']} x {d['seq']} tokens, micro-batch "
              f"{d['micro_batch']})", "objective", "logprobs' backward", "remat", "layers",
              "logits chunk", "update step", f"MFU of {d['peak_tflops']:.0f} TFLOP/s (6·N·tokens)",
              "MFU, every pass", "peak device GiB", "compile + first step", "device time: matmuls", "cuDNN attention",
              "fusions", "copies, other", "step time / the call's first row"]  # fmt: skip
    commands = "; ".join(f"`{f['command']}`" for f in files)
    return markdown_table(header, rows) + f"\n\nFrom {commands} ({d['date'][:10]}; the device time from `--profile`)."
