"""Small shared pieces used by every method script (see README)."""
