"""A small data-parallel training job: gloo, fixed seeds, DistributedSampler
with set_epoch, rank 0 saves the weights. Runs unchanged under torchrun and
under muster.

    muster --nproc-per-node=2 examples/pytorch/ddp_train.py OUT_DIR [EPOCHS]

Rank 0 writes OUT_DIR/model.pt (the state dict) and OUT_DIR/weights.json (each
parameter's raw bytes in hex, so runs can be compared bit for bit)."""
import json
import multiprocessing
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    out_dir = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()

    g = torch.Generator().manual_seed(1234)
    features = torch.randn(301, 10, generator=g)
    targets = (features @ torch.randn(10, 1, generator=g)).squeeze(1) + 0.1 * torch.randn(301, generator=g)
    dataset = TensorDataset(features, targets)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(1)
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x).squeeze(1), y)
            loss.backward()
            opt.step()
            total += loss.detach()
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} loss {total.item() / world:.6f}", flush=True)

    if rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        state = model.state_dict()
        torch.save(state, os.path.join(out_dir, "model.pt"))
        hexes = {k: v.detach().contiguous().numpy().tobytes().hex() for k, v in state.items()}
        # Written whole, then renamed: whoever waits for the file never reads half of it.
        path = os.path.join(out_dir, "weights.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"world_size": world, "weights": hexes}, f)
        os.replace(path + ".tmp", path)
    dist.barrier()
    dist.destroy_process_group()


def exit_without_finalizing(code=0):
    """Ends the process without Python's interpreter shutdown. torch's gloo
    backend keeps its worker threads after destroy_process_group(); a thread that
    lets go of a finished collective (and with it the last reference to a tensor
    that Python had handed over) while the interpreter shuts down cannot take the
    GIL, is cancelled, and the process aborts with "terminate called without an
    active exception", under torchrun and muster alike (about one run in ten on a
    busy two-core machine). Everything this script writes is written and flushed
    before it gets here. Under --run-path (muster's MUSTER_RUN_PATH_DONE_DIR, or
    torchrun's spawned process) the launcher's code still has to run after the
    script, so the script returns normally there."""
    if os.environ.get("MUSTER_RUN_PATH_DONE_DIR") or multiprocessing.parent_process() is not None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
    exit_without_finalizing()
