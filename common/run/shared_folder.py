"""A launch of several processes claims its output folder together (common/run/output_dir.py
`claim_output_dir`): rank 0's verdict reaches every rank, and every machine must read the token
rank 0 wrote in the folder's lock record, or the run stops before any model loads (machines
without a shared folder would otherwise fail at the first checkpoint)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from common.distributed.ranks import stop_every_rank
from common.run.folder_lock import LOCK


def every_rank_sees(args, accelerator, verdict: str | None, token: str) -> None:
    """Every rank: rank 0's `verdict` (a refusal line, or None) and `token` broadcast; a refusal
    stops every rank, and so does a machine that does not read `token` in --output_dir."""
    from accelerate.utils import broadcast_object_list, gather_object

    # after rank 0 wrote the marker: a barrier too
    verdict, token = broadcast_object_list([verdict, token])
    if verdict:
        stop_every_rank(accelerator, verdict)
    seen = _sees(Path(args.output_dir), token)
    # the machine's rank (set by torchrun / accelerate launch)
    node = os.environ.get("GROUP_RANK", "?")
    views = gather_object([(node, socket.gethostname(), seen)])
    blind = sorted({(node, host) for node, host, ok in views if not ok})
    if blind:
        names = ", ".join(f"node rank {node} (host {host})" for node, host in blind)
        stop_every_rank(
            accelerator,
            f"--output_dir {args.output_dir}: the machine with {names} does not see the "
            "folder rank 0 writes in; --output_dir must be a folder every machine shares (a "
            "network filesystem mounted at the same path, best given as an absolute path)",
        )


def _sees(folder: Path, token: str, wait_s: float = 2.0) -> bool:
    """Whether this process reads `token` in `folder`'s lock record (read again for `wait_s`: an NFS
    may lag)."""
    deadline = time.time() + wait_s
    while True:
        try:
            if json.loads((folder / LOCK).read_text()).get("launch") == token:
                return True
        except (OSError, ValueError, AttributeError):
            pass
        if time.time() > deadline:
            return False
        time.sleep(0.2)
