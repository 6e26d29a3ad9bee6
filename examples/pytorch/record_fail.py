"""A worker that raises inside @record on rank 1, for the failure report:
torchrun and muster both name the exception as the root cause."""
import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    rank = int(os.environ["RANK"])
    if rank == 1:
        raise ValueError(f"boom on rank{rank}")
    time.sleep(20)  # stopped by the launcher once rank 1 has failed


if __name__ == "__main__":
    main()
