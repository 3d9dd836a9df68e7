"""The embedded default policy, built offline and cached; imported only when `--model_name_or_path embedded`.

It is a char-level tokenizer (`tokenizers` WordLevel, one token per character) and a small
Llama-architecture decoder from a transformers config, warmed up by SFT on solver-generated Countdown
solutions. Llama is used because its directories reload through `AutoTokenizer` with the char
vocabulary intact (a `qwen2` directory reloads as Qwen2Tokenizer, which drops spaces and newlines).
The build is deterministic for a given recipe and cached under `$RLVR_CACHE` (default
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

EMBEDDED = "embedded"
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
CHARS = list("0123456789+-*/=() .,:;|?!#<>\n") + [chr(c) for c in range(97, 123)] + [chr(c) for c in range(65, 91)]


@dataclass(frozen=True)
class BaseRecipe:
    """Everything that determines the embedded base policy (its hash names the cache dir)."""
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_positions: int = 512
    sft_steps: int = 1500
    sft_batch_size: int = 64
    sft_lr: float = 1e-3
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]


def build_char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + CHARS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")  # every char, \n too
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")


def build_tiny_model(recipe: BaseRecipe, vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=recipe.hidden_size,
                      num_hidden_layers=recipe.num_layers, num_attention_heads=recipe.num_heads,
                      num_key_value_heads=recipe.num_kv_heads, intermediate_size=recipe.intermediate_size,
                      max_position_embeddings=recipe.max_positions, tie_word_embeddings=True,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(recipe.seed)
    return LlamaForCausalLM(cfg)


def cache_root() -> Path:
    return Path(os.environ.get("RLVR_CACHE", Path.home() / ".cache" / "rlvr-sampling"))


def sft_base_policy(model, tokenizer, recipe: BaseRecipe, log=print) -> dict:
    """Supervised warm-up on solver solutions of the training problems (loss on the answer only)."""
    from tqdm.auto import tqdm

    from common import countdown
    from common.logprobs import token_logprobs
    from common.masking import pad_sequences

    rng = random.Random(recipe.seed)
    train, _ = countdown.make_splits()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.sft_lr, weight_decay=0.0)
    warmup = max(1, recipe.sft_steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, 1 - s / recipe.sft_steps) ** 0.5)
    eos = tokenizer.eos_token_id
    model.train()
    losses = []
    bar = tqdm(range(recipe.sft_steps), desc="SFT of the embedded base policy", mininterval=2)
    for _ in bar:
        probs = [train[rng.randrange(len(train))] for _ in range(recipe.sft_batch_size)]
        prompts = [tokenizer(countdown.prompt_text(p), add_special_tokens=False).input_ids for p in probs]
        answers = []
        for p in probs:
            steps = rng.choice(countdown.solutions(p))
            answers.append(tokenizer(countdown.solution_text(steps), add_special_tokens=False).input_ids + [eos])
        batch = pad_sequences(prompts, answers, tokenizer.pad_token_id)
        lp, _ = token_logprobs(model, batch)
        loss = -(lp * batch.loss_mask).sum() / batch.loss_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}", refresh=False)
    return {"sft_final_loss": float(np.mean(losses[-50:]))}


@torch.no_grad()
def evaluate_base(model, tokenizer, n_samples: int = 8) -> dict:
    """Held-out greedy and sampled pass@1, and how groups of n_samples split (the regime RL sees)."""
    from common import countdown
    from common.generation import HFGenerator, SamplingConfig

    _, held = countdown.make_splits()
    gen = HFGenerator(model, tokenizer)
    prompts = [tokenizer(countdown.prompt_text(p), add_special_tokens=False).input_ids for p in held]

    def correct(g, n):
        texts = tokenizer.batch_decode(g.completion_ids, skip_special_tokens=True)
        return np.array([countdown.reward_binary(t, held[i // n]) for i, t in enumerate(texts)]).reshape(-1, n)

    greedy = correct(gen.generate(prompts, 1, SamplingConfig(max_new_tokens=32, temperature=0.0)), 1)
    k = correct(gen.generate(prompts, n_samples, SamplingConfig(max_new_tokens=32)), n_samples).sum(1)
    return {"heldout_greedy_pass@1": float(greedy.mean()), "heldout_sampled_pass@1": float(k.mean() / n_samples),
            f"groups_of_{n_samples}_all_fail": float((k == 0).mean()),
            f"groups_of_{n_samples}_all_pass": float((k == n_samples).mean()),
            f"groups_of_{n_samples}_balanced_3_to_5": float(((k >= 3) & (k <= 5)).mean())}


def ensure_embedded_base(recipe: BaseRecipe | None = None, log=print) -> Path:
    """Path of the cached embedded base policy, building it first if needed (atomic: tmp dir + rename)."""
    recipe = recipe or BaseRecipe()
    path = cache_root() / f"countdown-base-{recipe.key()}"
    if (path / "build_info.json").exists():
        return path
    log(f"building the embedded base policy into {path} (once; about 3 minutes on 2 cores)")
    t0 = time.time()
    torch_threads = torch.get_num_threads()
    tokenizer = build_char_tokenizer()
    with torch.random.fork_rng(devices=[]):  # the build seeds torch; the caller's random stream stays as it was
        model = build_tiny_model(recipe, len(tokenizer))
        info = sft_base_policy(model, tokenizer, recipe, log)
        info.update(evaluate_base(model, tokenizer))
    log(f"base policy held-out: {info}")
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info.update(recipe=asdict(recipe), build_seconds=round(time.time() - t0, 1), torch_threads=torch_threads,
                params=sum(p.numel() for p in model.parameters()))
    (tmp / "build_info.json").write_text(json.dumps(info, indent=2))
    if path.exists():  # another process finished first; keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, path)
    log(f"embedded base policy ready in {info['build_seconds']} s")
    return path
