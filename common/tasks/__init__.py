"""The run's task: datasets and prompts, scoring, user reward functions, held-out evaluation."""
