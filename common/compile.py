"""`--torch_compile`: HF generate's one-token decoding step compiled with `torch.compile` (inductor), on a KV cache of
fixed shape, with the compile cost and the recompilations counted for metrics.jsonl.

transformers compiles the decoding step itself when generate runs on a static cache with a `CompileConfig`
(`GenerationMixin._valid_auto_compile_criteria`, transformers 5.19 `generation/utils.py`); it does so on CUDA only
unless the config's `_compile_all_devices` is set, which is set here, so CPU runs compile too. The cache is
HFGenerator's compute-dtype static cache (common/generation.py). The prefill (one call per batch, whose width
varies) stays eager. Few shapes, so the compiled step is reused: the cache holds the batch's prompt width plus
max_new_tokens rounded up to `CACHE_STEP` positions, and a chunk of fewer rows than the generation batch size is
padded with copies of its last prompt up to a power of two (the copies' samples are dropped; they draw random
numbers, so such a chunk samples differently from an eager run with the same seed). Each new (rows, cache length)
pair compiles the step once more. The training and scoring passes stay eager: their packed rows change shape every
micro-batch.

A compile failure does not stop the run: that generate call is redone eagerly (from the same random state) and every
later one too, after one log line.
"""
from __future__ import annotations

import math

import torch

CACHE_STEP = 64  # cache lengths are multiples of this: one compiled step serves prompts of similar widths


class CompiledDecoding:
    """What HFGenerator passes to `generate` to run the compiled decoding step, and its eager fallback."""

    def __init__(self, backend="inductor", log=print):
        self.backend = backend  # torch.compile backend (a callable too: the tests give one that fails)
        self.log = log
        self.failed = False  # set by a compile failure: eager from then on
        self.graphs, self.seconds = compiled_graphs(), compile_seconds()  # this process's totals so far

    @staticmethod
    def bucket(rows: int, batch_size: int) -> int:
        """Rows a generate chunk is padded to: the next power of two, at most the generation batch size."""
        return min(batch_size, 1 << max(0, rows - 1).bit_length())

    @staticmethod
    def cache_length(width: int, max_new_tokens: int) -> int:
        """The static cache's length for a batch `width` tokens wide: a multiple of CACHE_STEP."""
        return math.ceil((width + max_new_tokens) / CACHE_STEP) * CACHE_STEP

    def config(self, model):
        """transformers' CompileConfig for the decoding step: static shapes; CUDA graphs on a GPU."""
        from transformers import CompileConfig

        cuda = next(model.parameters()).device.type == "cuda"
        # CPU kernels follow torch.set_num_threads (the scripts' thread policy) instead of the count at compile time
        options = None if cuda or self.backend != "inductor" else {"cpp.dynamic_threads": True}
        config = CompileConfig(dynamic=False, backend=self.backend, options=options,  # torch: options or a mode
                               mode="reduce-overhead" if cuda else None if options else "default")
        config._compile_all_devices = True  # transformers' switch for compiling off CUDA
        return config

    def generate(self, model, kwargs: dict, static_cache: dict):
        """`model.generate(**kwargs)` through the compiled decoding step on `static_cache` (generate's keywords for
        a cache of `cache_length`); a failed compile is redone eagerly from the same random state, and so is every
        later call."""
        if self.failed:
            return model.generate(**kwargs)
        device = kwargs["input_ids"].device
        rng = torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        try:
            return model.generate(**kwargs, **static_cache, compile_config=self.config(model))
        except Exception as error:  # noqa: BLE001  (any compile error: the eager call below raises real ones)
            self.fall_back(error)
            torch.set_rng_state(rng[0])
            if rng[1] is not None:
                torch.cuda.set_rng_state(rng[1], device)
            return model.generate(**kwargs)

    def fall_back(self, error: BaseException) -> None:
        self.failed = True
        while getattr(error, "inner_exception", None) or error.__cause__:  # torch wraps the backend's own error
            error = getattr(error, "inner_exception", None) or error.__cause__
        first = (str(error).strip().splitlines() or [""])[0][:200]
        self.log(f"--torch_compile: the compiled decoding step failed ({type(error).__name__}: {first}); "
                 "generating eagerly from here on")

    def metrics(self) -> dict:
        """metrics.jsonl's `compile_recompiles`, the graphs compiled since this object was made beyond the first (each
        new shape of the decoding step compiles it again), and `time_compile_s`, the seconds spent compiling since the
        previous call (the first generations' compile, apart from the step's own work)."""
        seconds, before = compile_seconds(), self.seconds
        self.seconds = seconds
        return {"compile_recompiles": max(0, compiled_graphs() - self.graphs - 1), "time_compile_s": seconds - before}


def compile_seconds() -> float:
    """Seconds torch.compile has spent compiling in this process (dynamo + backend, forward and backward)."""
    from torch._dynamo.utils import calculate_time_spent

    return float(calculate_time_spent().get("total_wall_time", 0.0))


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
