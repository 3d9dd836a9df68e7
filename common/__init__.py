"""Small shared pieces used by every method script (docs/development.md lists them)."""
