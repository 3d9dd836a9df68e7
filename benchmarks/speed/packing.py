"""Padded against padding-free (packed) training passes, where completion lengths vary: the update's forward +
backward (+ AdamW step) of one micro-batch, timed, for several completion caps.

Each case: `--sequences` prompt + completion pairs, prompts of 10-14 tokens, completions drawn uniformly from 1 to
the cap (so the padded layout wastes about half of the completion region), random tokens, the embedded policy
(or `--model_name_or_path`). The same batch goes through `token_logprobs` padded (`pad_sequences`) and packed
(`pack_tokens` = each `--row_tokens` value), median of `--repeats` after one warm-up. The two layouts give the same
numbers (tests/test_packing.py); this measures what they cost.

    python benchmarks/speed/packing.py                       # caps 32, 128, 512; rows of 128 and 256 tokens
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common.run.flags import parse_args  # noqa: E402


@dataclass
class Args:
    caps: str = "32,128,512"
    """comma-separated completion caps (max_new_tokens); lengths are uniform in 1..cap"""
    row_tokens: str = "128,256"
    """comma-separated packed row lengths to time"""
    sequences: int = 64
    """sequences in the micro-batch"""
    repeats: int = 5
    """timed repeats per layout (median; one warm-up first)"""
    num_threads: int = 2
    """torch CPU threads"""
    model_name_or_path: str = "embedded"
    """the policy (`embedded`: the cached tiny Countdown model)"""
    seed: int = 0
    """lengths and tokens"""


def main(args: Args) -> list[dict]:
    import torch

    from common.model.policy import load_policy
    from common.rl.logprobs import token_logprobs
    from common.rl.masking import pad_sequences

    torch.set_num_threads(args.num_threads)
    path = args.model_name_or_path
    if path == "embedded":
        from common.demo.tiny_model import ensure_embedded_base

        path = str(ensure_embedded_base())
    model, tokenizer = load_policy(path)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    vocab, rng = model.config.vocab_size, random.Random(args.seed)
    results = []
    print(
        "| completion cap | tokens (real) | layout | tokens computed | median s per update | vs padded |"
    )
    print("|---|---|---|---|---|---|")
    for cap in (int(c) for c in args.caps.split(",")):
        prompts = [
            [rng.randrange(3, vocab) for _ in range(rng.randint(10, 14))]
            for _ in range(args.sequences)
        ]
        completions = [
            [rng.randrange(3, vocab) for _ in range(rng.randint(1, cap))]
            for _ in range(args.sequences)
        ]
        real = sum(len(p) + len(c) for p, c in zip(prompts, completions))

        def update(pack: int) -> tuple[float, int]:
            batch = pad_sequences(prompts, completions, tokenizer.pad_token_id, pack_tokens=pack)
            start = time.perf_counter()
            logp, _ = token_logprobs(model, batch)
            (-(logp * batch.loss_mask).sum() / args.sequences).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return time.perf_counter() - start, batch.input_ids.numel()

        padded_s = None
        for pack in [0, *(int(r) for r in args.row_tokens.split(","))]:
            update(pack)  # warm-up
            runs = [update(pack) for _ in range(args.repeats)]
            seconds, computed = statistics.median(r[0] for r in runs), runs[0][1]
            padded_s = seconds if pack == 0 else padded_s
            layout = "padded" if pack == 0 else f"packed, rows of {pack}"
            results.append(
                {
                    "cap": cap,
                    "layout": layout,
                    "real_tokens": real,
                    "computed_tokens": computed,
                    "seconds": seconds,
                }
            )
            print(
                f"| {cap} | {real} | {layout} | {computed} | {seconds:.3f} | {padded_s / seconds:.2f}x |",
                flush=True,
            )
    return results


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
