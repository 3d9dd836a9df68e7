"""Where the embedded default's built pieces are kept between runs (the base policy, the task's
splits)."""

import os
from pathlib import Path


def cache_root() -> Path:
    """`$RLVR_CACHE`, by default `~/.cache/rlvr-sampling/`."""
    return Path(os.environ.get("RLVR_CACHE", Path.home() / ".cache" / "rlvr-sampling"))
