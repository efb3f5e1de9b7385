"""The paper's own figures per task (Yang, He-Yueya and Liang, arXiv 2509.01684): what our results are read beside."""

from __future__ import annotations

# Paper Table 1: Qwen2.5-3B prompted with AIDE, and Qwen2.5-3B after RL (best of 128 samples).
PAPER_TABLE1: dict[str, dict[str, float]] = {
    "detecting-insults-in-social-commentary": {"qwen2.5-3b": 0.870, "qwen2.5-3b-rl": 0.895},
    "learning-agency-lab-automated-essay-scoring-2": {"qwen2.5-3b": 0.331, "qwen2.5-3b-rl": 0.746},
    "random-acts-of-pizza": {"qwen2.5-3b": 0.589, "qwen2.5-3b-rl": 0.663},
    "tweet-sentiment-extraction": {"qwen2.5-3b": 0.027, "qwen2.5-3b-rl": 0.596},
    "tabular-playground-series-may-2022": {"qwen2.5-3b": 0.787, "qwen2.5-3b-rl": 0.913},
    "tabular-playground-series-dec-2021": {"qwen2.5-3b": 0.827, "qwen2.5-3b-rl": 0.951},
    "us-patent-phrase-to-phrase-matching": {"qwen2.5-3b": 0.065, "qwen2.5-3b-rl": 0.527},
    "plant-pathology-2020-fgvc7": {"qwen2.5-3b": 0.628, "qwen2.5-3b-rl": 0.970},
    "leaf-classification": {"qwen2.5-3b": 0.884, "qwen2.5-3b-rl": 0.124},
    "nomad2018-predict-transparent-conductors": {"qwen2.5-3b": 0.178, "qwen2.5-3b-rl": 0.059},
    "spooky-author-identification": {"qwen2.5-3b": 0.596, "qwen2.5-3b-rl": 0.404},
    "lmsys-chatbot-arena": {"qwen2.5-3b": 11.48, "qwen2.5-3b-rl": 1.081},
}
