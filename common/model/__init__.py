"""Loading the policy, its compute dtype, the frozen reference, LoRA."""
