"""Two gloo processes, each making and ending a process group `iterations` times the way a script's run ends:
DDP backward passes, an all-reduce, a barrier, then common.run.process.end_processes, then the model freed.
Usage: python tests/gloo_teardown.py ITERATIONS SETTLE_S STORE_DIR (prints "done" when every round ended); a negative
SETTLE_S destroys the group without end_processes."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.run.process import end_processes  # noqa: E402


class _Accelerator:
    """What end_processes uses of an Accelerator: the world size and end_training (which destroys the group)."""

    num_processes = 2

    @staticmethod
    def end_training():
        dist.destroy_process_group()


def rounds(rank: int, iterations: int, settle_s: float, store_dir: str) -> None:
    torch.set_num_threads(1)
    for i in range(iterations):
        store = dist.FileStore(f"{store_dir}/round-{i}", 2)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
        for _ in range(2):
            model(torch.randn(8, 64)).sum().backward()
        total = torch.ones(4)
        dist.all_reduce(total)
        del total
        dist.barrier()
        if settle_s < 0:  # the control: the group destroyed without end_processes
            _Accelerator.end_training()
        else:
            end_processes(_Accelerator(), settle_s=settle_s)
        del (
            model,
            store,
        )  # the DDP reducer holds the group: its destructor joins gloo's worker threads here


if __name__ == "__main__":
    iterations, settle_s, store_dir = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    mp.spawn(rounds, args=(iterations, settle_s, store_dir), nprocs=2)
    print("done", flush=True)
