"""The agent's environment: prompts -> sampler -> instrumenter -> executor -> grader -> reward, and what draws
from it without learning (evaluation).

- settings: `RolloutSettings`, `EvalSettings` (light: reading a config loads no rollout)
- rollout: `Environment`, `Sample`, `PromptItem`: one sample from prompt to reward
- task_mix: the prompt stream over a mix of tasks (scratch / improve), checkpointable
- improve_buffer: earlier solutions with their output, for the improve prompt
- evaluation: the paper's evaluation (scratch + improve, keep the better), mean and best of N
- search: search at test time over a budget of programs (independent, AIDE's policy, greedy), trees on the fleet
- protocols: the searches reported as the field does (ML-Agent's 8 runs, MLE-bench's medal rate over seeds)
"""
