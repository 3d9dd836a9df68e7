"""Colocated vLLM generation: an in-process `vllm.LLM` next to the training model, with one output
format.

`VLLMGenerator` is a drop-in for `HFGenerator` (common/generation/hf.py): same `generate` /
`sync_weights` and the same `Generations` (prompt-major, stop token kept, log-probs under logits /
temperature).

- One engine per process. Under accelerate/torchrun every rank builds its own engine
(`distributed_executor_backend="external_launcher"`, tensor_parallel_size=1) and samples its own
prompts.
- Once per update phase (after all of a step's optimizer steps) the script calls `sync_weights`,
  which pushes the training weights into the engine (`reload_weights` through `collective_rpc`) and
  drops the prefix cache, whose KV came from old weights.
- On a GPU the engine sleeps while the trainer trains: the scripts call `sleep()` once a sampling
  phase is over (level 2: weights and KV cache discarded; vLLM still keeps host copies of its small
  "runtime" and "cudagraph" pools and of the model's buffers), and the push, which maps the weights
  again and overwrites them all, must come before the next `generate` (which raises otherwise).
  Between the push and the end of the next sampling phase (evaluation included) the engine keeps its
  weights. On a CPU sleep mode does not exist, so it is skipped.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random
import warnings

import numpy as np
import torch
from torch.distributed.fsdp import FSDPModule

from common.generation.hf import Generations, SamplingConfig, end_token_ids
from common.model.lora import merged_state_dict

INSTALL_HINT = "--use_vllm needs vLLM: pip install -r requirements-vllm.txt"


def _import_vllm(on_cpu: bool):
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit(INSTALL_HINT)
    if on_cpu:
        # Read by vLLM at import/engine start, so they must be set first. In-process engine core:
        # the weight push hands tensors to the worker by reference. 1 GiB of KV cache is plenty for
        # the small CPU models this runs.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if "OMP_NUM_THREADS" not in os.environ:
            # One intra-op thread, for the trainer in this process too: on the shared 2-core
            # machines spinning OpenMP workers made generation calls take seconds (8-10 s seen)
            # instead of ~0.1 s, and a generate+train step was 1.5-2x faster with 1 thread. torch is
            # already imported, so the env var alone would not reach it; and vLLM's CPU worker
            # disables torch.set_num_threads once it starts.
            os.environ["OMP_NUM_THREADS"] = "1"
            torch.set_num_threads(1)
    else:
        # In-process on GPU too: collective_rpc then passes the CUDA weight tensors without pickling
        # them.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as e:  # installed but broken (e.g. a CUDA torchvision next to a CPU torch)
        raise SystemExit(f"{INSTALL_HINT} (import vllm failed: {e})") from e
    return vllm


def _process_layout(accelerator) -> tuple[int, int, int, bool]:
    """(rank, local_rank, world_size, launched by a distributed launcher)."""
    # the device accelerate picked (local index % visible GPUs), not the local rank
    if accelerator is not None:
        rank, world = accelerator.process_index, accelerator.num_processes
        local = (
            accelerator.device.index
            if accelerator.device.type == "cuda"
            else accelerator.local_process_index
        )
    else:
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
        world = int(os.environ.get("WORLD_SIZE", "1"))
    return rank, local, world, world > 1 or "RANK" in os.environ


class VLLMGenerator:
    """Sampling with a colocated vLLM engine; `HFGenerator`'s interface and output format."""

    # generate() samples from the engine's pushed copy: the trainer's FSDP shards stay sharded
    reads_policy = False

    def __init__(
        self,
        model_path: str,
        model,
        tokenizer,
        *,
        seed: int = 0,
        dtype: str = "float32",
        max_model_len: int = 1024,
        gpu_memory_utilization: float = 0.3,
        sleep: bool = True,
        accelerator=None,
    ):
        self.tokenizer = tokenizer
        self.seed = seed
        # generate() counter: with the seed and the rank it fixes every request's seed
        self.calls = 0
        # the scripts add --stop_token_ids (`end_token_ids`)
        self.end_ids = end_token_ids(tokenizer, model)
        self.on_cpu = not torch.cuda.is_available()
        self.rank, local_rank, world, distributed = _process_layout(accelerator)
        vllm = _import_vllm(self.on_cpu)
        self._sampling_params_cls = vllm.SamplingParams

        if self.on_cpu and dtype != "float32":
            # bf16/fp16 on CPU: log-probs drift from the trainer's by ~0.07 and the engine can die
            # with an illegal instruction on CPUs without the bf16 extensions.
            warnings.warn(f"vLLM on CPU: dtype {dtype} replaced by float32")
            dtype = "float32"
        n_pos = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if n_pos:  # vLLM refuses a max_model_len above what the model's positions allow
            max_model_len = min(max_model_len, n_pos)

        kwargs = dict(
            model=str(model_path),
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            # Log-probs after temperature (and top-k/top-p), i.e. of the distribution actually
            # sampled; with top_p=1 and top_k off this is log_softmax(logits / T), what HFGenerator
            # reports.
            logprobs_mode="processed_logprobs",
            # Ignore the checkpoint's generation_config.json: sampling settings come only from
            # SamplingConfig, and the stop tokens from `end_ids` (which holds that file's
            # eos_token_id list), as in HFGenerator.
            generation_config="vllm",
        )
        if self.on_cpu:
            # no Triton/torch.compile on CPU; compiling would only cost start time
            kwargs["enforce_eager"] = True
        else:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
            kwargs["enable_sleep_mode"] = sleep
        if distributed:
            # One engine inside each training process, reusing the launcher's process group. TP=1:
            # every rank holds the whole model and generates only its own prompts.
            kwargs["distributed_executor_backend"] = "external_launcher"
            kwargs["tensor_parallel_size"] = 1
            self._prepare_distributed(self.rank, local_rank, world, self.on_cpu)

        # vLLM seeds the global RNGs with `seed` while it starts; in-process those are the trainer's
        # RNGs, so keep the trainer's streams as they were.
        py_state, np_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[] if self.on_cpu else [torch.cuda.current_device()]):
            self.llm = vllm.LLM(**kwargs)
        random.setstate(py_state)
        np.random.set_state(np_state)

        self.sleep_enabled = sleep and not self.on_cpu
        # memory tags currently offloaded/freed ("weights", "kv_cache")
        self._asleep: set[str] = set()
        # the checkpoints save `state_dict()` per rank (common/run/checkpoint.py)
        if accelerator is not None:
            accelerator.register_for_checkpointing(self)

    def state_dict(self) -> dict:
        """The request-seed counter, saved with every checkpoint (this rank's): a resumed run draws
        the seeds the uninterrupted run would have, not the first steps' again."""
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state["calls"])

    @staticmethod
    def _prepare_distributed(rank: int, local_rank: int, world: int, on_cpu: bool) -> None:
        # external_launcher takes this process's rank from RANK and its GPU from LOCAL_RANK (vLLM
        # 0.32 uniproc_executor.py; gpu_worker.py asserts LOCAL_RANK < visible GPUs). Assigned, not
        # defaulted: with one visible GPU per process (e.g. SLURM) the launcher's LOCAL_RANK is not
        # the GPU index accelerate chose.
        os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"] = (
            str(rank),
            str(local_rank),
            str(world),
        )
        if not on_cpu:
            # else every rank would first touch (and allocate on) GPU 0
            torch.cuda.set_device(local_rank)
        # It also reuses torch.distributed's default group: accelerate has made one, a bare torchrun
        # has not. With a single process vLLM makes it itself from the env vars.
        if world > 1 and not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend="gloo" if on_cpu else "nccl")

    # ---- sleep mode (GPU only; vLLM 0.32 line numbers) ----
    def sleep(self) -> None:
        """A sampling phase is over: the engine's GPU memory goes to the trainer until the next
        `sync_weights`, which must come before the next `generate`. HFGenerator's is a no-op."""
        if self.sleep_enabled and self._asleep != {"weights", "kv_cache"}:
            # Level 2 discards the weights and the KV cache without a copy, but still copies to
            # pinned host memory its "runtime" pool (KV-cache initialisation state,
            # v1/worker/gpu_worker.py:887-896) and "cudagraph" pool
            # (device_allocator/sleep_mode_backend.py:127-137, cumem.py:256-276) and every
            # registered buffer of the model, e.g. rotary tables (gpu_worker.py:298-309; back on
            # wake, 337-346). Level 1 would also copy the weights to host and back
            # (cumem.py:256-276, 352-360): a host copy of the model per rank, moved twice per step,
            # of weights that the push replaces anyway. The price: no generate until the push.
            self.llm.sleep(level=2)
            self._asleep = {"weights", "kv_cache"}

    def _wake_up(self, tags: tuple[str, ...]) -> None:
        # Only tags still asleep: given one that is awake, vLLM logs a warning and wakes none of the
        # tags (v1/executor/abstract.py:394-404).
        todo = sorted(tag for tag in tags if tag in self._asleep)
        if not todo:
            return
        fully_awake = self.llm.wake_up(tags=todo)
        self._asleep.difference_update(todo)
        # sleep() paused vLLM's scheduler; it resumes only once nothing is asleep, which wake_up
        # returns (v1/engine/core.py:997-1019). Paused, it admits no request: generate() would wait
        # forever.
        if not fully_awake and not self._asleep:
            raise RuntimeError(
                f"vLLM wake_up(tags={todo}) left the engine partly asleep, so its scheduler stays "
                "paused and generation would hang: vLLM's record of what is asleep differs from "
                "this "
                "backend's (was the engine put to sleep or woken outside VLLMGenerator?)"
            )

    # ---- weights ----
    @torch.no_grad()
    def sync_weights(self, model) -> None:
        """Push the training model's current weights into the engine (an FSDP model stays sharded:
        each tensor is gathered as vLLM reads it). The scripts call this once per update phase,
        after `sleep()`."""
        # Writing into slept weights would hit unmapped memory: map them again (after a level-2
        # sleep their contents are gone until the push below). The KV cache stays unmapped until
        # generate(), as in TRL's and verl's pushes; the engine is not put back to sleep, since
        # level 2 would discard the weights just pushed.
        self._wake_up(("weights",))
        # state_dict, not named_parameters: with tied embeddings the latter omits lm_head.weight,
        # and a model whose vLLM head is separate would silently keep the old head; and after a
        # level-2 sleep a layer that gets no weight keeps its discarded storage
        # (model_loader/reload/layerwise.py:255-267). The tensors are views of the live parameters
        # (no copy); vLLM's loaders copy them into their own layout. --fsdp: each tensor gathered as
        # vLLM reads it (every rank pushes)
        if isinstance(model, FSDPModule):
            from common.distributed.fsdp import iter_full_weights

            weights = iter_full_weights(model)
        else:
            weights = list(merged_state_dict(model).items())  # LoRA: adapters folded in, base names
        # reload_weights runs the model's own load_weights path (renaming, QKV/gate-up fusion, CPU
        # repacking). Measured on CPU (0.04-0.3 s for the tiny model); same call on GPU, where it
        # should be re-checked.
        self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=iter(weights)))
        if not self.llm.reset_prefix_cache():  # cached KV blocks were computed with the old weights
            raise RuntimeError(
                "vLLM did not reset its prefix cache after the weight push (requests still "
                "running?)"
            )

    # ---- sampling ----
    def _request_seed(self, prompt_index: int) -> int:
        # Distinct per (seed, rank, call, prompt): equal seeds on different prompts give correlated
        # samples (same uniform draws). vLLM gives the k-th of n samples seed + k, so stay well
        # below 2**31.
        key = f"{self.seed}/{self.rank}/{self.calls}/{prompt_index}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % (
            2**31 - 2**20
        )

    def generate(self, prompt_ids: list[list[int]], n: int, cfg: SamplingConfig) -> Generations:
        stop_ids = self.end_ids + [t for t in cfg.stop_token_ids if t not in self.end_ids]
        greedy = cfg.temperature <= 0
        params = [
            self._sampling_params_cls(
                n=n,
                temperature=0.0 if greedy else cfg.temperature,
                top_p=1.0 if greedy else cfg.top_p,
                top_k=cfg.top_k if (cfg.top_k > 0 and not greedy) else -1,  # vLLM's "off" is -1
                max_tokens=cfg.max_new_tokens,
                stop_token_ids=stop_ids,
                logprobs=0 if cfg.logprobs else None,  # only the sampled token's log-prob
                seed=self._request_seed(i),
                detokenize=False,  # token ids are all we return; no stop strings to match
            )
            for i in range(len(prompt_ids))
        ]
        self.calls += 1
        if "weights" in self._asleep:
            raise RuntimeError(
                "VLLMGenerator.generate() after sleep() without a weight push: sleep level 2 "
                "discarded "
                "the engine's weights; call sync_weights(policy) first"
            )
        self._wake_up(("kv_cache",))
        # a rank without a prompt this step (fewer prompts than processes): no request to make
        if not prompt_ids:
            return Generations(
                prompt_ids=[], completion_ids=[], logprobs=[], finish_reasons=[], n=n
            )
        outs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompt_ids], params, use_tqdm=False
        )

        completion_ids, logprobs, reasons = [], [], []
        for out in outs:  # vLLM returns requests in input order -> prompt-major
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)  # includes the stop token when one ended the sample
                if c.finish_reason not in ("stop", "length"):
                    raise RuntimeError(
                        f"vLLM request {out.request_id} ended with {c.finish_reason!r}"
                    )
                completion_ids.append(ids)
                logprobs.append(
                    [step[t].logprob for t, step in zip(ids, c.logprobs)] if cfg.logprobs else []
                )
                reasons.append(c.finish_reason)
        return Generations(
            prompt_ids=[list(p) for p in prompt_ids],
            completion_ids=completion_ids,
            logprobs=logprobs,
            finish_reasons=reasons,
            n=n,
        )


def vllm_generator(args, model_path: str, policy, tokenizer, accelerator) -> VLLMGenerator:
    """--use_vllm: the run's engine, on the policy's weights, from the script's flags."""
    return VLLMGenerator(
        model_path,
        policy,
        tokenizer,
        seed=args.seed,
        dtype=args.dtype,
        max_model_len=args.vllm_max_model_length,
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        accelerator=accelerator,
    )
