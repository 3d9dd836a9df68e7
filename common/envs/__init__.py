"""Agent environments: your class (`--environment PATH.py:ClassName`) and the multi-turn rollouts,
prefix replay included, that play it (docs/custom_env.md)."""
