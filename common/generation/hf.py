"""Generation backends with one output format: prompts as token-id lists in, `n` samples per prompt
out, prompt-major, each with its token ids, the log-prob of each sampled token under the *sampling*
distribution (logits / temperature) and a finish reason ("stop": a stop token ended it, "length":
max_new_tokens did). `HFGenerator` runs `model.generate` on the training model itself;
`VLLMGenerator` (common/generation/vllm_backend.py) is a colocated vLLM engine, to which the scripts
push the weights once per update (`sync_weights`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from common.model.policy import autocast
from common.rl.logprobs import score_completions

# the preallocated caches (transformers' StaticCache)
STATIC_CACHES = ("static", "offloaded_static")


def cache_kwargs(model, cache_implementation: str | None, dtype: str, max_cache_len: int) -> dict:
    """`generate`'s keywords for `--cache_implementation`: none (the default dynamic cache), the
    name, or a static cache built in the compute dtype (still one transformers compiles the decoding
    step for on a GPU)."""
    if cache_implementation in STATIC_CACHES:
        from common.generation.static_cache import static_cache_kwargs

        return static_cache_kwargs(model, cache_implementation, dtype, max_cache_len)
    return {"cache_implementation": cache_implementation} if cache_implementation else {}


def resolve_cache_implementation(
    requested: str | None, device_type: str, model_or_config, fsdp: bool = False
) -> tuple[str | None, str]:
    """`--cache_implementation` as HF generate gets it, and one line saying which cache and why.
    `auto`: on CUDA, the static cache where transformers supports it for the model and FSDP is off
    (common/generation/static_cache.py `auto_on_cuda`), else transformers' default dynamic cache
    (None: generate's own default, so CPU runs are unchanged). Any other value is kept as given."""
    if requested != "auto":
        return requested, f"KV cache: {requested or 'dynamic (transformers default)'}"
    if device_type != "cuda":
        return None, f"KV cache: dynamic (--cache_implementation auto on {device_type})"
    from common.generation.static_cache import auto_on_cuda

    return auto_on_cuda(model_or_config, fsdp)


def end_token_ids(
    tokenizer, model, stop_token_ids: str | list[int] | None = (), log=None
) -> list[int]:
    """The ids that end every completion, once each: the tokenizer's EOS, every id of the model's
    `generation_config.eos_token_id` (a chat model's end-of-turn token besides its EOS, e.g. Gemma's
    `<end_of_turn>`) and the user's `stop_token_ids` (ids, or --stop_token_ids's comma-separated
    text, read in common/generation/stop_tokens.py). `log`: one line naming them."""
    if stop_token_ids:
        from common.generation.stop_tokens import checked_stop_token_ids

        stop_token_ids = checked_stop_token_ids(stop_token_ids, tokenizer, model)
    listed = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    sources = {
        "the tokenizer's EOS": [tokenizer.eos_token_id],
        "the model's generation_config": listed if isinstance(listed, (list, tuple)) else [listed],
        "--stop_token_ids": list(stop_token_ids or ()),
    }
    ids, named = [], []
    for source, tokens in sources.items():
        new = [token for token in dict.fromkeys(tokens) if token is not None and token not in ids]
        ids += new
        if log is not None:
            named += [
                f"{token} {tokenizer.convert_ids_to_tokens(token)!r} ({source})" for token in new
            ]
    if log is not None:
        log(f"generation stops at token ids {', '.join(named)}")
    return ids


@dataclass
class SamplingConfig:
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    # besides the generator's `end_ids` (e.g. a newline)
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: bool = True  # False: skip them (evaluation), Generations.logprobs is then empty lists


@dataclass
class Generations:
    prompt_ids: list[list[int]]  # len P (one per prompt)
    # len P*n, prompt-major; includes the stop token if one ended it
    completion_ids: list[list[int]]
    logprobs: list[list[float]]  # len P*n, one float per completion token
    finish_reasons: list[str]  # len P*n, "stop" | "length"
    n: int

    def prompt_index(self, i: int) -> int:
        return i // self.n


class HFGenerator:
    """Sampling with `transformers` generate, batched, left-padded."""

    # generate() runs the training model: under --fsdp it must be gathered (`gathered`)
    reads_policy = True

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int = 256,
        dtype: str = "float32",
        cache_implementation: str | None = None,
        compiled=None,
    ):
        self.model = model  # the (unwrapped) training model: always current, nothing to sync
        self.tokenizer, self.batch_size = tokenizer, batch_size
        self.dtype = dtype  # compute dtype (autocast over the fp32 weights)
        # None: transformers' default (a dynamic cache)
        self.cache_implementation = cache_implementation
        # the scripts add --stop_token_ids (`end_token_ids`)
        self.end_ids = end_token_ids(tokenizer, model)
        # --torch_compile: the run's TorchCompile (common/generation/compile.py), the decoding step
        # compiled on a static cache; None: eager
        self.compiled = compiled
        on_cpu = next(model.parameters()).device.type == "cpu"
        if on_cpu and cache_implementation in ("offloaded", "offloaded_static"):
            from common.generation.static_cache import without_offloading

            self.cache_implementation = without_offloading(cache_implementation)

    def sync_weights(self, model) -> None:
        self.model = model

    def sleep(self) -> None:
        """Nothing to free: generation runs on the training model (VLLMGenerator's frees its
        engine's memory)."""

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, cfg: SamplingConfig) -> Generations:
        # eval mode while generating (the scripts train in train mode): no dropout, and measured
        # ~20% faster on CPU (tiny model, 128 x 32 tokens: 0.19-0.21 s eval vs 0.24-0.26 s train);
        # the mode is restored after
        was_training = self.model.training
        self.model.eval()
        try:
            with autocast(next(self.model.parameters()).device, self.dtype):
                return self._generate(prompt_ids, n, cfg)
        finally:
            self.model.train(was_training)

    def _generate(self, prompt_ids: list[list[int]], n: int, cfg: SamplingConfig) -> Generations:
        tok = self.tokenizer
        # scoring ignores truncation
        if cfg.logprobs and cfg.temperature > 0 and (cfg.top_p < 1 or cfg.top_k > 0):
            raise ValueError(
                f"HFGenerator: log-probs with top_p={cfg.top_p} / top_k={cfg.top_k} would not be "
                "those of the sampled distribution (pi_old); top-p / top-k are for evaluation "
                "(logprobs=False)"
            )
        stop_ids = self.end_ids + [t for t in cfg.stop_token_ids if t not in self.end_ids]
        device = next(self.model.parameters()).device
        flat = [p for p in prompt_ids for _ in range(n)]
        out_ids, out_reasons = [], []
        for s in range(0, len(flat), self.batch_size):
            chunk = flat[s : s + self.batch_size]
            rows = len(chunk)
            compiled = self.compiled is not None and not self.compiled.failed["decoding"]
            # few shapes for CUDA graphs: pad to a bucket, cut after
            if compiled and self.compiled.pads_rows(device):
                chunk = chunk + [chunk[-1]] * (self.compiled.bucket(rows, self.batch_size) - rows)
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), tok.pad_token_id, dtype=torch.long)
            att = torch.zeros((len(chunk), width), dtype=torch.long)
            for r, p in enumerate(chunk):  # left padding so every row ends at the same position
                ids[r, width - len(p) :] = torch.tensor(p)
                att[r, width - len(p) :] = 1
            gen = self._model_generate(
                input_ids=ids.to(device),
                attention_mask=att.to(device),
                do_sample=cfg.temperature > 0,
                temperature=cfg.temperature if cfg.temperature > 0 else None,
                top_p=cfg.top_p if cfg.temperature > 0 else None,
                top_k=cfg.top_k if cfg.temperature > 0 else None,
                max_new_tokens=cfg.max_new_tokens,
                eos_token_id=stop_ids,
                pad_token_id=tok.pad_token_id,
                **cache_kwargs(
                    self.model, self.cache_implementation, self.dtype, width + cfg.max_new_tokens
                ),
                # transformers runs FSDP models in lock-step (an all-reduce per token); --fsdp
                # generates inside `gathered` (whole weights, no communication), where ranks finish
                # independently
                synced_gpus=False,
            )[:rows, width:].tolist()
            for row in gen:
                cut = next((j for j, t in enumerate(row) if t in stop_ids), None)
                out_ids.append(row if cut is None else row[: cut + 1])
                out_reasons.append("length" if cut is None else "stop")
        logps = [[] for _ in out_ids]
        # under logits / T, by one extra pass (keeping generate's scores holds [B, V] per token)
        if cfg.logprobs:
            temperature = cfg.temperature if cfg.temperature > 0 else 1.0
            logps = score_completions(
                self.model, flat, out_ids, tok.pad_token_id, self.batch_size, device, temperature
            )
        return Generations(
            prompt_ids=[list(p) for p in prompt_ids],
            completion_ids=out_ids,
            logprobs=logps,
            finish_reasons=out_reasons,
            n=n,
        )

    def _model_generate(self, **kwargs):
        """`model.generate`, with --torch_compile through its compiled decoding step on a static
        cache."""
        if self.compiled is None:
            return self.model.generate(**kwargs)
        length = self.compiled.cache_length(kwargs["input_ids"].shape[1], kwargs["max_new_tokens"])
        return self.compiled.generate(
            self.model, kwargs, cache_kwargs(self.model, "static", self.dtype, length)
        )
