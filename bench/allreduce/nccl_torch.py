"""torch.distributed's all_reduce on NCCL, the counterpart of nccl_bench.cpp:
float32 sum on a CUDA tensor, one rank per GPU, the same sizes, warm-up and
timing (median of five batches of the slowest rank's mean per call). Rank 0
prints one JSON line per size."""
import datetime
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def sizes():
    top = int(os.environ.get("MUSTER_BENCH_MAX_BYTES", 1 << 30))
    b = 4 << 10
    while b <= top:
        yield b
        b *= 4


def iterations(nbytes):
    return max(5, min(500, (8 << 30) // nbytes))


def main():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=300))
    dev = torch.device("cuda", torch.cuda.current_device())
    for nbytes in sizes():
        t = torch.zeros(nbytes // 4, dtype=torch.float32, device=dev)
        iters = max(1, iterations(nbytes) // 5)
        for _ in range(min(iters, 20)):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        batches = []
        for _ in range(5):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            mine = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=dev)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            batches.append(mine.item())
        if dist.get_rank() == 0:
            print(json.dumps({"bytes": nbytes, "seconds": statistics.median(batches)}), flush=True)
        del t
    dist.destroy_process_group()


main()
