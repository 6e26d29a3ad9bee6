"""bench/allreduce, the reference: torch.distributed's gloo all_reduce on CPU
float32 tensors, the same sizes, batches and timing as allreduce_bench."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    size = 4 << 10
    while size <= 64 << 20:
        t = torch.ones(size // 4, dtype=torch.float32)
        iters = max(1, max(5, min(2000, (512 << 20) // size)) // 5)
        for _ in range(min(iters, 20)):
            dist.all_reduce(t)
        batches = []
        for _ in range(5):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            mine = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            batches.append(mine.item())
        if rank == 0:
            print(json.dumps({"bytes": size, "seconds": sorted(batches)[2]}), flush=True)
        size *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Without the interpreter's shutdown: a gloo worker thread that drops its last
    # tensor during it aborts the process (see examples/pytorch/ddp_train.py).
    sys.stdout.flush()
    os._exit(0)
