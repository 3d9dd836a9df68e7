"""The run's task: datasets and their prompts, scoring, user reward functions, held-out evaluation."""
