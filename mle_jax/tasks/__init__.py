"""Tasks: registry, MLE-bench folders, preparers, graders, prompts."""
