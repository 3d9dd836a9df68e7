"""`--torch_compile`: the passes that run the model compiled with `torch.compile` (inductor), with
the compile cost and the recompilations counted for metrics.jsonl. One `TorchCompile` per run serves
both:

- HF generate's one-token decoding step, on a KV cache of fixed shape. transformers compiles that
  step itself when generate runs on a static cache with a `CompileConfig`
  (`GenerationMixin._valid_auto_compile_criteria`, transformers 5.19 `generation/utils.py`); it does
  so on CUDA only unless the config's `_compile_all_devices` is set, which is set here, so CPU runs
  compile too. The cache is HFGenerator's compute-dtype static cache (common/generation/hf.py). The
  prefill (one call per batch, whose width varies) stays eager. Few shapes, so the compiled step is
  reused: the cache holds the batch's prompt width plus max_new_tokens rounded up to a step of 16
  positions, or of an eighth of the length's power of two for long caches (8 lengths per doubling).
  The step is compiled with static shapes first; at the first new row count or cache length dynamo
  compiles it once more with that dimension dynamic (`CompileConfig(dynamic=None)`), and that graph
  serves every later size: a multi-turn episode's growing prompts compile it twice in all, not once
  per shape (which ran past dynamo's recompile limit). On a GPU, where CUDA graphs record one graph
  per shape, a chunk of fewer rows than the generation batch size is also padded with copies of its
  last prompt up to a power of two (the copies' samples are dropped; they draw random numbers, so
  such a chunk samples differently from an eager run with the same seed); on CPU rows are not
  padded, so a compiled run samples as the eager run does.
- The training and scoring forward of a packed batch (common/rl/masking.py `pack_sequences`;
  backward included, through AOTAutograd), compiled with dynamic shapes: the row count and the row
  width (at most --pack_row_tokens, or the longest sequence) are symbols, so one graph serves every
  micro-batch (a single row specialises once more). It returns the logits of every position (packed
  rows predict a completion token at almost every column anyway), and runs without CUDA graphs (they
  would record, and keep the memory of, one graph per shape). Padded (not packed) batches stay
  eager.

A compile failure, dynamo's recompile limit included, does not stop the run: that call is redone
eagerly (generation from the same random state) and every later one of the same pass too, after one
log line. The backward graph is compiled together with the forward (not lazily at the first
`.backward()`, which runs in the method file, outside any fallback), so a backward that cannot
compile falls back the same way. Under several processes each step's metrics call makes the ranks
agree: a pass that failed on any rank runs eagerly on every rank from then on, and the line names
the ranks it failed on.
"""

from __future__ import annotations

import torch

CACHE_STEP_MIN = 16  # the finest cache-length step: a short cache wastes at most 15 positions


class TorchCompile:
    """A run's compiled passes: `generate` through the compiled decoding step (HFGenerator) and
    `logits`, the compiled forward of a packed batch (common/rl/logprobs.py `token_logprobs`), each
    with its eager fallback; `metrics` for metrics.jsonl."""

    def __init__(self, backend="inductor", log=print):
        # torch.compile backend (a callable too: the tests give one that fails)
        self.backend = backend
        self.log = log
        # set by a compile failure: that pass eager from then on
        self.failed = {"decoding": False, "forward": False}
        # this process's totals so far
        self.graphs, self.seconds = compiled_graphs(), compile_seconds()
        # (pass, grad mode) seen: each compiles a first graph, which is no recompile
        self.firsts: set = set()
        self._forward = None  # the compiled packed forward, made at its first use

    # ---- the decoding step ----

    @staticmethod
    def bucket(rows: int, batch_size: int) -> int:
        """Rows a generate chunk is padded to: the next power of two, at most the generation batch
        size."""
        return min(batch_size, 1 << max(0, rows - 1).bit_length())

    def pads_rows(self, device: torch.device) -> bool:
        """Whether generate chunks are padded to a `bucket`: only where CUDA graphs record one graph
        per shape. On CPU the decoding step's dynamic row dimension serves every row count, and
        unpadded chunks draw the eager run's random numbers."""
        return self.options(device)["mode"] == "reduce-overhead"

    @staticmethod
    def cache_length(width: int, max_new_tokens: int) -> int:
        """The static cache's length for a batch `width` tokens wide: width + max_new_tokens rounded
        up to a multiple of CACHE_STEP_MIN, or of an eighth of the length's power of two when that
        is larger (8 lengths per doubling)."""
        need = width + max_new_tokens
        step = max(CACHE_STEP_MIN, 1 << max(0, need.bit_length() - 4))
        return -(-need // step) * step

    def options(self, device: torch.device, cuda_graphs: bool = True) -> dict:
        """torch.compile's mode / options: CUDA graphs on a GPU (`cuda_graphs`); on CPU the kernels
        follow torch.set_num_threads (the scripts' thread policy) instead of the thread count at
        compile time."""
        if device.type == "cuda" or self.backend != "inductor":
            return {
                "mode": "reduce-overhead" if device.type == "cuda" and cuda_graphs else "default",
                "options": None,
            }
        # torch takes options or a mode
        return {"mode": None, "options": {"cpp.dynamic_threads": True}}

    def config(self, model):
        """transformers' CompileConfig for the decoding step: static shapes until a second shape
        makes dynamo mark the dimension that changed dynamic (`dynamic=None`)."""
        from transformers import CompileConfig

        config = CompileConfig(
            dynamic=None, backend=self.backend, **self.options(next(model.parameters()).device)
        )
        config._compile_all_devices = True  # transformers' switch for compiling off CUDA
        return config

    def generate(self, model, kwargs: dict, static_cache: dict):
        """`model.generate(**kwargs)` through the compiled decoding step on `static_cache`
        (generate's keywords for a cache of `cache_length`); a failed compile is redone eagerly from
        the same random state, and so is every later call."""
        if self.failed["decoding"]:
            return model.generate(**kwargs)
        device = kwargs["input_ids"].device
        rng = (
            torch.get_rng_state(),
            torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        )
        # every (rows, cache length) after the first compiles the step again
        self.firsts.add(("decoding",))
        try:
            # past dynamo's recompile limit a graph would run eagerly without a word: raise, and
            # fall back below
            with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
                return model.generate(**kwargs, **static_cache, compile_config=self.config(model))
        except Exception as error:  # noqa: BLE001  (any compile error: the eager call below raises real ones)
            self.fall_back("decoding", "the compiled decoding step", "generating", error)
            torch.set_rng_state(rng[0])
            if rng[1] is not None:
                torch.cuda.set_rng_state(rng[1], device)
            return model.generate(**kwargs)

    # ---- the packed training / scoring forward ----

    def logits(self, model, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """[rows, W, V] logits of a packed batch (attention within each sequence, from
        `position_ids`), compiled with dynamic shapes; under grad, backward runs compiled too. Eager
        after a failed compile."""
        if not self.failed["forward"]:
            if self._forward is None:
                self._forward = torch.compile(
                    packed_logits,
                    dynamic=True,
                    backend=self.backend,
                    **self.options(input_ids.device, cuda_graphs=False),
                )
            # a reference model of the policy's shape reuses it
            self.firsts.add(("forward", torch.is_grad_enabled()))
            try:
                # compile the backward now, inside this try: with dynamic shapes AOTAutograd would
                # otherwise retry a failed backward compile at `.backward()` and raise there
                with (
                    torch._functorch.config.patch(force_non_lazy_backward_lowering=True),
                    torch._dynamo.config.patch(fail_on_recompile_limit_hit=True),
                ):
                    return self._forward(model, input_ids, position_ids)
            except Exception as error:  # noqa: BLE001  (as in generate: the eager call raises real errors)
                self.fall_back("forward", "the compiled training forward", "running it", error)
        return packed_logits(model, input_ids, position_ids)

    def fall_back(self, which: str, what: str, doing: str, error: BaseException) -> None:
        self.failed[which] = True
        # torch wraps the backend's own error
        while getattr(error, "inner_exception", None) or error.__cause__:
            error = getattr(error, "inner_exception", None) or error.__cause__
        first = (str(error).strip().splitlines() or [""])[0][:200]
        self.log(
            f"--torch_compile: {what} failed ({type(error).__name__}: {first}); {doing} eagerly "
            "from here on"
        )

    def agree(self, gather) -> None:
        """Every rank runs a pass eagerly once it failed on any rank; `gather` is a collective that
        stacks a tensor from every rank (accelerate's `Accelerator.gather`), so every rank must call
        this at the same point."""
        passes = sorted(self.failed)
        mine = torch.tensor([[float(self.failed[name]) for name in passes]])
        every = gather(mine).view(-1, len(passes)).cpu()
        for column, name in enumerate(passes):
            ranks = [rank for rank in range(every.shape[0]) if every[rank, column] > 0]
            # some ranks still compile it: all switch, one line says so
            if ranks and len(ranks) < every.shape[0]:
                self.log(
                    f"--torch_compile: the compiled {name} pass failed on rank(s) {ranks}; every "
                    "rank runs it "
                    "eagerly from here on"
                )
            self.failed[name] = bool(ranks)

    def metrics(self, accelerator=None) -> dict:
        """metrics.jsonl's `compile_recompiles`, the graphs compiled since this object was made
        beyond each pass's first (per grad mode for the forward; each new shape of the decoding step
        compiles it again), and `time_compile_s`, the seconds spent compiling since the previous
        call (forward and backward graphs). With an `accelerator` of several processes the ranks
        first agree on which passes run eagerly (`agree`)."""
        if accelerator is not None and accelerator.num_processes > 1:
            self.agree(accelerator.gather)
        seconds, before = compile_seconds(), self.seconds
        self.seconds = seconds
        return {
            "compile_recompiles": max(0, compiled_graphs() - self.graphs - len(self.firsts)),
            "time_compile_s": seconds - before,
            "compile_eager_passes": sum(self.failed.values()),
        }


def packed_logits(model, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """The model's logits at every position of packed rows: no attention mask and no KV cache, so
    transformers builds the block-diagonal causal mask from `position_ids` (common/rl/masking.py
    `pack_sequences`)."""
    return model(
        input_ids=input_ids, position_ids=position_ids, attention_mask=None, use_cache=False
    ).logits


def compile_seconds() -> float:
    """Seconds torch.compile has spent compiling in this process (dynamo + backend, forward and
    backward)."""
    from torch._dynamo.utils import calculate_time_spent

    return float(calculate_time_spent().get("total_wall_time", 0.0))


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
