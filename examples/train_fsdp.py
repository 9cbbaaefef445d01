"""Train GPT-2 with FSDP2 and remat-ir on two processes.

    torchrun --nproc_per_node 2 examples/train_fsdp.py          # CPU, gloo
    torchrun --nproc_per_node 2 examples/train_fsdp.py --ddp    # DDP instead of FSDP2

The order matters as with `torch.utils.checkpoint`: remat-ir first (rank 0 lowers
and plans, every rank receives the plan), then `fully_shard` on each block and
on the module `remat` returned (the FSDP root). Every rank reads its own shard of
the batch; each step prints the loss averaged over ranks and, on rank 0, the
peak memory of the step per rank next to FSDP alone. docs/distributed.md says
what happens inside.
"""

import argparse
import copy
import gc
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import remat_ir  # noqa: E402
from remat_ir.ir.units import human_bytes  # noqa: E402
from remat_ir.runtimes.memory import measure_peak  # noqa: E402
from models import gpt2  # noqa: E402


def main(steps: int = 3) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddp", action="store_true", help="DistributedDataParallel instead of FSDP2")
    options = parser.parse_args()
    on_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if on_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if on_cuda else torch.device("cpu")
    if on_cuda:
        torch.cuda.set_device(device)
    model, inputs = gpt2()  # the same weights on every rank (seeded)
    model.to(device)
    batch = inputs["input_ids"].to(device)
    mine = batch.chunk(world)[rank]  # this rank's sequences
    shard = dict(input_ids=mine, labels=mine, use_cache=False)
    plain = copy.deepcopy(model)

    scheduled = remat_ir.remat(model, (), example_kwargs=shard, budget="50%")
    if options.ddp:
        from torch.nn.parallel import DistributedDataParallel
        trained = DistributedDataParallel(scheduled)
        baseline = DistributedDataParallel(plain)
    else:
        from torch.distributed.fsdp import fully_shard
        for block in model.transformer.h:
            fully_shard(block)
        trained = fully_shard(scheduled)
        for block in plain.transformer.h:
            fully_shard(block)
        baseline = fully_shard(plain)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-3)
    wrapper = "DDP" if options.ddp else "FSDP2"

    def step(module):
        loss = module(**shard).loss
        loss.backward()
        return loss.detach()

    for k in range(steps):
        torch.manual_seed(k + 1000 * rank)
        base_peak = measure_peak(lambda: step(baseline), device).peak_bytes
        baseline.zero_grad()
        torch.manual_seed(k + 1000 * rank)
        measured = measure_peak(lambda: step(trained), device)
        optimizer.step()
        optimizer.zero_grad()
        loss = measured.result.clone()
        dist.all_reduce(loss)
        if rank == 0:
            print(f"step {k}: loss {loss.item() / world:.4f}; peak per rank {wrapper} + remat-ir "
                  f"{human_bytes(measured.peak_bytes)}, {wrapper} alone {human_bytes(base_peak)}",
                  flush=True)
    del trained, baseline, scheduled, plain, optimizer
    gc.collect()  # DDP/FSDP cycles collected after the group is gone abort the process
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
