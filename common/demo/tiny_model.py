"""The embedded default policy, built offline and cached; imported only when `--model_name_or_path
embedded`.

It is a char-level tokenizer (`tokenizers` WordLevel, one token per character) and a small
Llama-architecture decoder from a transformers config, warmed up by SFT on the embedded Countdown
level mix (countdown.LEVELS): solver solutions, and on the 3- and 5-number levels a share of
careless answers (valid steps that ignore the target), so the base starts where RL has room
(docs/benchmark.md). Llama is used because its directories reload through `AutoTokenizer` with the
char vocabulary intact (a `qwen2` directory reloads as Qwen2Tokenizer, which drops spaces and
newlines). The build is deterministic for a given recipe and cached under `$RLVR_CACHE` (default
`~/.cache/rlvr-sampling/`), keyed by a hash of the recipe, so later runs load it in a second.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from common.demo.cache import cache_root
from common.model.policy import library_bars_off

EMBEDDED = "embedded"
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
CHARS = (
    list("0123456789+-*/=() .,:;|?!#<>\n")
    + [chr(c) for c in range(97, 123)]
    + [chr(c) for c in range(65, 91)]
)


@dataclass(frozen=True)
class BaseRecipe:
    """Everything that determines the embedded base policy (its hash names the cache dir)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_positions: int = 512
    sft_steps: int = 3000
    sft_batch_size: int = 64
    sft_lr: float = 1e-3
    careless: tuple[float, ...] = (0.0, 0.85, 0.5)
    """per level of countdown.LEVELS: the share of SFT answers that are careless (valid steps on the
    given numbers that ignore the target), so the base often fails problems it could solve: room for
    RL (docs/benchmark.md)"""
    seed: int = 0

    def key(self) -> str:
        from common.demo.countdown import LEVELS  # the SFT data depends on the levels too

        spec = {**asdict(self), "levels": [asdict(level) for level in LEVELS]}
        return hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]


def build_char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + CHARS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # every char, \n too
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def build_tiny_model(recipe: BaseRecipe, vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=recipe.hidden_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        intermediate_size=recipe.intermediate_size,
        max_position_embeddings=recipe.max_positions,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(recipe.seed)
    return LlamaForCausalLM(cfg)


SHIPPED = Path(__file__).resolve().parents[2] / "assets"
"""Built policies committed with the repo (`assets/<cache name>/`): the default base and the
multi-turn warm-up, so a fresh clone starts RL at once instead of spending ~15 minutes of SFT first.
A cache dir's name hashes its recipe, so a changed recipe finds no shipped copy and is built."""


def weights_sha256(path: Path) -> str:
    return hashlib.sha256((Path(path) / "model.safetensors").read_bytes()).hexdigest()


def restore_shipped(path: Path, log=print) -> bool:
    """Copy the shipped build named like `path` into the cache (atomic: tmp dir + rename) when there
    is one and its weights hash matches its build_info.json; False when there is none or it is
    damaged (the caller builds)."""
    shipped = SHIPPED / Path(path).name
    if os.environ.get("RLVR_NO_SHIPPED") == "1" or not (shipped / "build_info.json").exists():
        return False
    want = json.loads((shipped / "build_info.json").read_text()).get("weights_sha256")
    if want != weights_sha256(shipped):
        log(
            f"warning: {shipped} does not match its build_info.json's weights_sha256; building "
            "from the recipe"
        )
        return False
    tmp = Path(path).with_name(Path(path).name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(shipped, tmp)
    if Path(path).exists():  # another process got there first
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, path)
    log(
        f"using the shipped build {shipped.relative_to(SHIPPED.parent)} (its recipe hash matches; "
        f"copied to {path})"
    )
    return True


# build_info.json keeps the first SFT losses: a rebuild must retrace them (test_shipped_base.py)
TRACE_STEPS = 20


def sft_step(model, optimizer, scheduler, batch) -> float:
    """One supervised step of the offline builders: mean negative log-likelihood of the batch's
    loss-mask tokens, gradients clipped at norm 1; returns the loss."""
    from common.rl.logprobs import token_logprobs

    logp, _ = token_logprobs(model, batch)
    loss = -(logp * batch.loss_mask).sum() / batch.loss_mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    return loss.item()


def sft_base_policy(
    model, tokenizer, recipe: BaseRecipe, log=print, stop_after: int | None = None
) -> dict:
    """Supervised warm-up on the training problems of every level (loss on the answer only): a
    random solver solution, or with the level's `careless` probability a random valid chain that
    misses the target. `stop_after` ends it early (same schedule): the tests retrace the first steps
    of a shipped build."""
    from tqdm.auto import tqdm

    from common.demo import countdown
    from common.rl.masking import pad_sequences

    rng = random.Random(recipe.seed)
    train, _ = countdown.make_level_splits()
    careless = {
        level.tag: share for level, share in zip(countdown.LEVELS, recipe.careless, strict=True)
    }
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.sft_lr, weight_decay=0.0)
    warmup = max(1, recipe.sft_steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, 1 - s / recipe.sft_steps) ** 0.5
    )
    eos = tokenizer.eos_token_id
    model.train()
    losses = []
    bar = tqdm(
        range(stop_after or recipe.sft_steps), desc="SFT of the embedded base policy", mininterval=2
    )
    for _ in bar:
        picks = [train[rng.randrange(len(train))] for _ in range(recipe.sft_batch_size)]
        prompts = [
            tokenizer(countdown.prompt_text(p), add_special_tokens=False).input_ids
            for _, p in picks
        ]
        answers = [
            tokenizer(
                countdown.solution_text(
                    countdown.sample_steps(p, rng, rng.random() >= careless[tag])
                ),
                add_special_tokens=False,
            ).input_ids
            + [eos]
            for tag, p in picks
        ]
        losses.append(
            sft_step(model, opt, sched, pad_sequences(prompts, answers, tokenizer.pad_token_id))
        )
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}", refresh=False)
    return {
        "sft_final_loss": float(np.mean(losses[-50:])),
        "sft_loss_trace": [round(x, 6) for x in losses[:TRACE_STEPS]],
    }


@torch.no_grad()
def evaluate_base(
    model, tokenizer, n_prompts: int = 256, n_samples: int = 8, max_new_tokens: int = 48
) -> dict:
    """The regime RL starts in, per level and overall, on the first `n_prompts` training problems
    (what `--prompt_pool 256` trains on) and on as many held-out ones: sampled pass@1 (T=1), greedy
    pass@1, pass@8, zero-variance groups of 4 (each prompt's 8 samples as two groups) and prompts
    with pass rate < 0.1 / > 0.8."""
    from common.demo import countdown
    from common.generation.hf import HFGenerator, SamplingConfig

    train, held = countdown.make_level_splits()
    gen = HFGenerator(model, tokenizer)
    out = {}
    for split, items in (("train", train[:n_prompts]), ("heldout", held[:n_prompts])):
        prompts = [
            tokenizer(countdown.prompt_text(p), add_special_tokens=False).input_ids
            for _, p in items
        ]

        def correct(g, n):
            texts = tokenizer.batch_decode(g.completion_ids, skip_special_tokens=True)
            return np.array(
                [countdown.reward_binary(t, items[i // n][1]) for i, t in enumerate(texts)]
            ).reshape(-1, n)

        greedy = correct(
            gen.generate(
                prompts, 1, SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0)
            ),
            1,
        )
        wins = correct(
            gen.generate(prompts, n_samples, SamplingConfig(max_new_tokens=max_new_tokens)),
            n_samples,
        )
        tags = np.array([tag for tag, _ in items])
        for tag in ["all"] + [level.tag for level in countdown.LEVELS]:
            sel = np.ones(len(items), bool) if tag == "all" else tags == tag
            rate, fours = wins[sel].mean(1), wins[sel].reshape(-1, 4).sum(1)
            out[f"{split}_{tag}"] = {
                "prompts": int(sel.sum()),
                "pass@1": round(float(rate.mean()), 3),
                "greedy_pass@1": round(float(greedy[sel].mean()), 3),
                f"pass@{n_samples}": round(float((rate > 0).mean()), 3),
                "zero_var_groups_of_4": round(float(((fours == 0) | (fours == 4)).mean()), 3),
                "pass_rate_below_0.1": round(float((rate < 0.1).mean()), 3),
                "pass_rate_above_0.8": round(float((rate > 0.8).mean()), 3),
            }
    return out


def ensure_embedded_base(
    recipe: BaseRecipe | None = None, log=print, eval_prompts: int = 256
) -> Path:
    """Path of the cached embedded base policy, building it first if needed (atomic: tmp dir +
    rename); the build measures the base on `eval_prompts` training and held-out problems
    (build_info.json)."""
    recipe = recipe or BaseRecipe()
    path = cache_root() / f"countdown-base-{recipe.key()}"
    if (path / "build_info.json").exists() or restore_shipped(path, log):
        return path
    log(f"building the embedded base policy into {path} (once; 17 minutes measured at 1 thread)")
    t0 = time.time()
    torch_threads = torch.get_num_threads()
    tokenizer = build_char_tokenizer()
    # the build seeds torch; the caller's random stream stays as it was
    with torch.random.fork_rng(devices=[]):
        model = build_tiny_model(recipe, len(tokenizer))
        info = sft_base_policy(model, tokenizer, recipe, log)
        info.update(evaluate_base(model, tokenizer, eval_prompts))
    log(f"base policy held-out: {info}")
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # transformers' "Writing model shards" bar: the SFT bar above stays the only one
    with library_bars_off():
        model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info.update(
        recipe=asdict(recipe),
        build_seconds=round(time.time() - t0, 1),
        torch_threads=torch_threads,
        params=sum(p.numel() for p in model.parameters()),
        weights_sha256=weights_sha256(tmp),
    )
    (tmp / "build_info.json").write_text(json.dumps(info, indent=2))
    if path.exists():  # another process finished first; keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, path)
    log(f"embedded base policy ready in {info['build_seconds']} s")
    return path
