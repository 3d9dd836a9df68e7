"""The spell's model and its warm start: a random Qwen2 with a tokenizer trained here, supervised fine-tuning on
generated Countdown demonstrations until greedy pass@1 reaches the target (cached), or the shipped embedded
base at `--size tiny`."""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

from benchmarks.gpu.budget import SIZES, Args, Stop


def build_model_dir(path: Path, size: str) -> Path:
    """A random Qwen2 model + a byte-level BPE trained on generated Countdown text, saved as an HF dir (cached)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from common.demo import countdown

    if (path / "config.json").exists():
        return path
    cfg = dict(SIZES[size])
    train, _ = countdown.make_splits()
    corpus = [
        countdown.prompt_text(p) + countdown.solution_text(countdown.solutions(p)[0])
        for p in train[:4000]
    ]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=cfg.pop("vocab_size"),
            special_tokens=["<|endoftext|>", "<|pad|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|pad|>"
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            tie_word_embeddings=True,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            max_position_embeddings=2048,
            **cfg,
        )
    )
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    sample = corpus[0]
    reloaded = AutoTokenizer.from_pretrained(
        path
    )  # the scripts load it this way: it must round-trip
    if reloaded.decode(reloaded(sample, add_special_tokens=False).input_ids) != sample:
        raise SystemExit(
            f"{path}: the saved tokenizer does not round-trip {sample!r} through AutoTokenizer"
        )
    print(
        f"built {path}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
        f"vocabulary {len(tokenizer)}",
        flush=True,
    )
    return path


def greedy_pass_rate(model, tokenizer, problems, max_new_tokens: int, dtype: str) -> float:
    """Greedy pass@1 (binary verifier) of `model` on (level tag, problem) pairs."""
    from common.demo import countdown
    from common.generation.hf import HFGenerator, SamplingConfig
    from common.tasks.loading import PromptEncoder

    encode = PromptEncoder(tokenizer, templated=False)  # as the scripts encode Countdown prompts
    prompts = [encode(countdown.prompt_text(p)) for _, p in problems]
    gens = HFGenerator(model, tokenizer, dtype=dtype).generate(
        prompts, 1, SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0, logprobs=False)
    )
    texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
    return sum(countdown.reward_binary(text, p) for text, (_, p) in zip(texts, problems)) / len(
        problems
    )


def warm_start(random_dir: Path, warm_dir: Path, args: Args, stop: Stop) -> dict:
    """SFT of the random model on generated Countdown demonstrations until greedy pass@1 on 128 training prompts
    reaches `--warm_target` (the embedded base's recipe, common/demo/tiny_model.py: solver solutions and, per level, its
    share of careless answers; loss on the answer only). Saved to `warm_dir` with warm_start.json; cached."""
    import torch

    from common.demo import countdown
    from common.demo.tiny_model import BaseRecipe
    from common.model.policy import autocast, load_policy
    from common.rl.logprobs import token_logprobs
    from common.rl.masking import pad_sequences

    if (warm_dir / "warm_start.json").exists():
        info = json.loads((warm_dir / "warm_start.json").read_text())
        print(
            f"warm start: cached in {warm_dir} ({info['steps']} steps, greedy pass@1 {info['greedy_pass@1']:.3f})"
        )
        return {**info, "cached": True}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_policy(str(random_dir))
    model.to(device).train()
    rng = random.Random(0)
    train, _ = countdown.make_level_splits()
    careless = dict(
        zip([level.tag for level in countdown.LEVELS], BaseRecipe().careless, strict=True)
    )
    probe = random.Random(1).sample(train, 128)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.warm_lr, weight_decay=0.0)
    warmup = max(1, args.warm_max_steps // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup)
    )
    eos, t0, trace, rate, step, first_loss = tokenizer.eos_token_id, time.time(), [], 0.0, 0, None
    print(
        f"warm start: SFT until greedy pass@1 >= {args.warm_target} on 128 training prompts "
        f"(at most {args.warm_max_steps} steps)",
        flush=True,
    )
    while step < args.warm_max_steps and time.time() - t0 < args.warm_max_s and stop.reason is None:
        picks = [train[rng.randrange(len(train))] for _ in range(args.warm_batch_size)]
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
        batch = pad_sequences(prompts, answers, tokenizer.pad_token_id).to(device)
        with autocast(device, args.dtype):
            logp, _ = token_logprobs(model, batch)
        loss = -(logp * batch.loss_mask).sum() / batch.loss_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        step += 1
        first_loss = first_loss if first_loss is not None else loss.item()
        last = step == args.warm_max_steps or time.time() - t0 >= args.warm_max_s
        if step % args.warm_check_every == 0 or last:
            rate = greedy_pass_rate(model, tokenizer, probe, args.max_completion_length, args.dtype)
            model.train()
            trace.append(
                {
                    "step": step,
                    "seconds": round(time.time() - t0, 1),
                    "loss": round(loss.item(), 4),
                    "greedy_pass@1": rate,
                }
            )
            print(
                f"  warm start step {step}: {trace[-1]['seconds']} s, loss {loss.item():.3f}, "
                f"greedy pass@1 {rate:.3f}",
                flush=True,
            )
            if rate >= args.warm_target:
                break
    info = {
        "steps": step,
        "seconds": round(time.time() - t0, 1),
        "greedy_pass@1": rate,
        "first_loss": first_loss,
        "reached": rate >= args.warm_target,
        "target": args.warm_target,
        "lr": args.warm_lr,
        "batch_size": args.warm_batch_size,
        "device": str(device),
        "trace": trace,
    }
    if stop.reason is not None:  # cut short: not a warm start to cache
        return {**info, "status": f"stopped ({stop.reason})"}
    tmp = warm_dir.with_name(warm_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "warm_start.json").write_text(json.dumps(info, indent=2))
    shutil.rmtree(warm_dir, ignore_errors=True)
    os.replace(tmp, warm_dir)
    print(
        f"warm start: {step} steps in {info['seconds']} s, greedy pass@1 {rate:.3f} "
        f"({'target reached' if info['reached'] else 'BELOW the target'}); saved {warm_dir}",
        flush=True,
    )
    return {**info, "status": "ok"}


def embedded_warm_dir(path: Path) -> Path:
    """`--size tiny`: the shipped embedded base (already SFT'd by the same recipe), copied into the output dir."""
    from common.demo import countdown
    from common.demo.tiny_model import ensure_embedded_base
    from common.model.policy import load_policy

    if not (path / "warm_start.json").exists():
        base = ensure_embedded_base()
        shutil.copytree(base, path, dirs_exist_ok=True)
        model, tokenizer = load_policy(str(path))
        train, _ = countdown.make_level_splits()
        rate = greedy_pass_rate(
            model, tokenizer, random.Random(1).sample(train, 128), 48, "float32"
        )
        (path / "warm_start.json").write_text(
            json.dumps(
                {
                    "steps": 0,
                    "seconds": 0.0,
                    "greedy_pass@1": rate,
                    "reached": True,
                    "source": str(base),
                }
            )
        )
    return path
