"""The RL primitives: advantages, losses, masking, per-token log-probs, answer verifiers, the
multi-turn episode record, PROS's Gibbs sampler."""
