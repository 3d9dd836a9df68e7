"""VLLMGenerator's sleep / wake / push order against a stub engine (no vLLM needed): the stub keeps vLLM 0.32's
sleep-mode bookkeeping (what is asleep, what level 2 discards, the scheduler paused until nothing is asleep) and
refuses what vLLM would get wrong or hang on, so the order the scripts follow can be checked on CPU."""

import types

import pytest
import torch

from common.generation import vllm_backend
from common.generation.hf import SamplingConfig


class StubLLM:
    """`vllm.LLM` as far as VLLMGenerator uses it. Line numbers: vLLM 0.32.0."""

    def __init__(self, **kwargs):
        self.asleep: set[str] = (
            set()
        )  # the executor's sleeping tags (v1/executor/abstract.py:379-417)
        self.weights = (
            None  # what the weights' memory holds: the pushed tensors, or None once discarded
        )
        self.paused = False  # the scheduler, paused by sleep() (v1/engine/core.py:959-976)
        self.events: list = []
        self.seen: list = []  # the weights each generate() sampled from

    def sleep(self, level: int = 1, mode: str = "abort"):
        self.events.append(f"sleep{level}")
        self.paused = True
        if "weights" in self.asleep:  # abstract.py:382-385
            return
        if (
            level == 2
        ):  # sleep_mode_backend.py:127-137: only level 1 keeps a host copy of the weights
            self.weights = None
        self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags=None) -> bool:
        self.events.append(("wake", tuple(tags)))
        if self.asleep and all(
            tag in self.asleep for tag in tags
        ):  # abstract.py:394-404: else nothing is woken
            self.asleep -= set(tags)
        fully_awake = not self.asleep  # core.py:997-1019: the scheduler resumes only then
        self.paused = self.paused and not fully_awake
        return fully_awake

    def collective_rpc(self, method, kwargs):
        assert method == "reload_weights"
        assert "weights" not in self.asleep, "push into unmapped weights"
        self.weights = {name: tensor.clone() for name, tensor in kwargs["weights_iterator"]}
        self.events.append("push")

    def reset_prefix_cache(self) -> bool:
        return True

    def generate(self, prompts, params, use_tqdm=False):
        if self.paused or self.asleep:
            raise AssertionError(
                f"generate with {sorted(self.asleep)} asleep: vLLM would wait forever"
            )
        assert self.weights is not None, "generate from discarded weights"
        self.events.append("generate")
        self.seen.append({name: tensor.clone() for name, tensor in self.weights.items()})
        step = types.SimpleNamespace(logprob=-0.5)
        return [
            types.SimpleNamespace(
                request_id=str(i),
                outputs=[
                    types.SimpleNamespace(
                        index=j,
                        token_ids=[1, 0],
                        finish_reason="stop",
                        logprobs=[{1: step}, {0: step}],
                    )
                    for j in range(param["n"])
                ],
            )
            for i, param in enumerate(params)
        ]


@pytest.fixture
def engine(monkeypatch):
    """(generator, policy): a VLLMGenerator on the stub with sleep mode on, as on a GPU, whose engine starts with
    the policy's weights (both load the same checkpoint)."""
    fake = types.SimpleNamespace(LLM=StubLLM, SamplingParams=lambda **kwargs: kwargs)
    monkeypatch.setattr(vllm_backend, "_import_vllm", lambda on_cpu: fake)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    policy = torch.nn.Linear(3, 2)
    gen = vllm_backend.VLLMGenerator("model-dir", policy, types.SimpleNamespace(eos_token_id=0))
    gen.sleep_enabled = True  # sleep mode exists on GPUs only
    gen.llm.weights = {name: tensor.clone() for name, tensor in policy.state_dict().items()}
    return gen, policy


CFG = SamplingConfig(max_new_tokens=2)


def generate(gen, policy) -> None:
    """One generate() that must sample from the policy's current weights."""
    out = gen.generate([[5, 6]], 2, CFG)
    assert out.completion_ids == [[1, 0], [1, 0]] and out.logprobs == [[-0.5, -0.5]] * 2
    assert gen.llm.seen[-1].keys() == policy.state_dict().keys()
    assert all(
        torch.equal(gen.llm.seen[-1][name], value) for name, value in policy.state_dict().items()
    )


def test_every_generate_sees_the_pushed_weights_and_an_awake_kv_cache(engine):
    # the scripts' order: step-0 evaluation (two generates: held-out + paper eval), then per step a sampling phase
    # of several generates (Ada's rounds, PS's turns), sleep(), the update, the push, sometimes an evaluation
    gen, policy = engine
    generate(gen, policy)
    generate(gen, policy)
    for step in range(1, 4):
        generate(gen, policy)
        generate(gen, policy)
        gen.sleep()
        assert (
            gen.llm.asleep == {"weights", "kv_cache"} and gen.llm.weights is None
        )  # all memory to the trainer
        with torch.no_grad():
            policy.weight.add_(1.0)  # the update
        gen.sync_weights(policy)
        assert gen.llm.asleep == {"kv_cache"}  # the push maps the weights only
        if step == 2:
            generate(gen, policy)
    # level 2, and nothing copied between host and GPU: the weights are woken only to be overwritten, the KV cache
    # only to generate
    push, wake_kv = ["sleep2", ("wake", ("weights",)), "push"], [("wake", ("kv_cache",))]
    sampling = ["generate", "generate"]
    assert (
        gen.llm.events
        == sampling
        + sampling
        + push
        + wake_kv
        + sampling
        + push
        + wake_kv
        + ["generate"]
        + sampling
        + push
    )


def test_generate_after_sleep_without_a_push_raises(engine):
    gen, policy = engine
    gen.sleep()
    with pytest.raises(RuntimeError, match="without a weight push"):
        gen.generate([[5, 6]], 1, CFG)
    gen.sync_weights(policy)
    generate(gen, policy)


def test_resume_push_into_an_awake_engine_then_generate(engine):
    # resume: the engine starts awake with the base weights and the checkpoint's weights are pushed before step 1
    gen, policy = engine
    with torch.no_grad():
        policy.bias.fill_(3.0)
    gen.sync_weights(policy)
    generate(gen, policy)
    assert gen.llm.events == [
        "push",
        "generate",
    ]  # nothing was asleep: no wake_up (vLLM would only warn)


def test_wake_up_that_leaves_vllm_asleep_raises_instead_of_hanging(engine):
    gen, policy = engine
    gen.sleep()
    gen.sync_weights(policy)
    gen.llm.asleep.add("weights")  # vLLM's record drifted from the backend's
    with pytest.raises(RuntimeError, match="partly asleep"):
        gen.generate([[5, 6]], 1, CFG)


def test_without_sleep_mode_nothing_sleeps(engine):
    # CPU (or sleep=False): sleep() is a no-op, so generating after it without a push is fine
    gen, policy = engine
    gen.sleep_enabled = False
    gen.sleep()
    generate(gen, policy)
    assert gen.llm.events == ["generate"]
