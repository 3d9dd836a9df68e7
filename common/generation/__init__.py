"""Generation backends (HF generate, colocated vLLM) and compiled passes."""
