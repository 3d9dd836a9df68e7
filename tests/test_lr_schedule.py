"""--lr_scheduler_type: transformers' schedules by name over --max_steps with the run's warm-up
(--warmup_steps or --warmup_ratio), logged as `lr` at each step; a resume continues the curve
exactly, and a resume that would stretch it (a new --max_steps) is a changed flag."""

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from conftest import run_main

SMALL = ["--prompts_per_step", "4", "--num_generations", "2", "--eval_prompts", "4",
         "--eval_samples", "1", "--eval_steps", "0", "--max_completion_length", "8",
         "--num_threads", "1", "--save_steps", "1", "--save_total_limit", "0",
         "--prompt_pool", "16"]  # fmt: skip


def transformers_lrs(name: str, lr: float, warmup: int, steps: int, **settings) -> list[float]:
    """The rate after each of `steps` updates under transformers' `get_scheduler`."""
    from transformers import get_scheduler

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = get_scheduler(name, optimizer, warmup, steps, scheduler_specific_kwargs=settings)
    rates = []
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        rates.append(scheduler.get_last_lr()[0])
    return rates


def rows(folder) -> list[dict]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith(("time_", "time/"))}
        for line in lines
    ]


def test_cosine_is_transformers_curve_and_a_resume_continues_it_exactly(tiny_base, tmp_path):
    out = tmp_path / "run"
    argv = ["ra_rloo.py", "--model_name_or_path", tiny_base, *SMALL, "--learning_rate", "1e-4",
            "--lr_scheduler_type", "cosine", "--warmup_ratio", "0.25"]  # fmt: skip
    run_main([*argv, "--output_dir", str(out), "--max_steps", "4"])
    full = rows(out)
    # a warm-up of ceil(0.25 x 4) = 1 step, then half a cosine down to 0 at step 4
    assert [row["lr"] for row in full[1:]] == transformers_lrs("cosine", 1e-4, 1, 4)
    assert len({row["lr"] for row in full[1:]}) == 4

    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    checkpoint = str(resumed / "checkpoint-2")
    run_main([*argv, "--output_dir", str(resumed), "--max_steps", "4",
              "--resume_from_checkpoint", checkpoint, "--discard_later_checkpoints"])  # fmt: skip
    assert rows(resumed) == full  # steps 3 and 4 again: the same rates, the same updates

    # the curve is laid over --max_steps: stretching it on a resume changes every later rate
    with pytest.raises(SystemExit, match=r"flags differ from the run's: --max_steps 4 -> 6"):
        run_main([*argv, "--output_dir", str(out), "--max_steps", "6",
                  "--resume_from_checkpoint", "auto"])  # fmt: skip
    from common.run.folder_lock import release_all

    release_all()


def test_schedule_flags_are_checked_in_one_line(tmp_path):
    from common.run.flags import parse_args
    from common.run.setup import make_scheduler
    from ra_rloo import Args

    both = ["--warmup_steps", "3", "--warmup_ratio", "0.1"]
    with pytest.raises(SystemExit, match=r"^--warmup_ratio 0.1 and --warmup_steps 3 both set"):
        parse_args(Args, both)
    config = tmp_path / "c.yaml"
    config.write_text("warmup_steps: 3\n")  # one from a --config file counts as given too
    with pytest.raises(SystemExit, match="both set the warm-up"):
        parse_args(Args, ["--config", str(config), "--warmup_ratio", "0.1"])
    with pytest.raises(SystemExit, match=r"^--lr_scheduler_kwargs \[1\]: must be a JSON object"):
        parse_args(Args, ["--lr_scheduler_kwargs", "[1]"])

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    args = parse_args(Args, ["--lr_scheduler_type", "cosine_with_min_lr", "--max_steps", "8"])
    with pytest.raises(SystemExit, match=r"^--lr_scheduler_type cosine_with_min_lr with "):
        make_scheduler(optimizer, args)  # it needs min_lr or min_lr_rate
    settings = '{"min_lr_rate": 0.1}'
    args = SimpleNamespace(**{**vars(args), "lr_scheduler_kwargs": settings, "warmup_steps": 2})
    scheduler = make_scheduler(optimizer, args)
    rates = []
    for _ in range(8):
        optimizer.step()
        scheduler.step()
        rates.append(scheduler.get_last_lr()[0])
    assert rates == transformers_lrs("cosine_with_min_lr", 1.0, 2, 8, min_lr_rate=0.1)


@pytest.mark.parametrize("name", ["linear", "cosine"])
def test_a_warmup_ratio_rounds_up_as_transformers_does(name):
    # 0.3 x 5 = 1.5 warm-up steps: transformers' TrainingArguments.get_warmup_steps rounds up to 2
    from transformers import TrainingArguments

    from common.run.flags import parse_args
    from common.run.setup import make_scheduler
    from ra_rloo import Args

    flags = ["--lr_scheduler_type", name, "--warmup_ratio", "0.3", "--max_steps", "5"]
    args = parse_args(Args, [*flags, "--learning_rate", "1.0"])
    warmup = TrainingArguments(output_dir="unused", warmup_steps=0.3).get_warmup_steps(5)
    assert warmup == 2
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = make_scheduler(optimizer, args)
    rates = []
    for _ in range(5):
        optimizer.step()
        scheduler.step()
        rates.append(scheduler.get_last_lr()[0])
    assert rates == transformers_lrs(name, 1.0, warmup, 5)
