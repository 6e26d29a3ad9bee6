"""muster::DistributedSampler yields torch's indices, bit for bit, over a grid
of sizes (up to 10^6 and more), odd replica counts, seeds, epochs, shuffle and
drop_last; and muster::randperm is torch.randperm."""
import os
import subprocess
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the compatibility tests need PyTorch: scripts/install-deps.sh installs it")
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

TOOL = os.environ.get("MUSTER_SAMPLER_TOOL", "")


def muster_indices(*args):
    assert TOOL, "MUSTER_SAMPLER_TOOL is not set (run through ctest)"
    with tempfile.NamedTemporaryFile() as f:
        subprocess.run([TOOL, f.name, *map(str, args)], check=True, timeout=300)
        return np.fromfile(f.name, dtype="<i8")


def torch_indices(n, replicas, rank, seed, epoch, shuffle, drop_last):
    sampler = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed,
                                 drop_last=drop_last)
    sampler.set_epoch(epoch)
    out = np.array(list(iter(sampler)), dtype="<i8")
    assert len(out) == len(sampler)
    return out


GRID = [
    # n, replicas, seed, epoch
    (1, 1, 0, 0), (1, 3, 0, 0), (2, 3, 5, 1), (7, 3, 0, 0), (10, 4, 42, 3), (50, 7, 1234, 2), (1000, 5, 0, 9),
    (1001, 8, 2**31 - 1, 1), (4097, 3, 2**32 - 1, 7), (99_991, 13, 7, 0), (1_000_000, 3, 0, 1),
    (1_234_567, 7, 99, 4),
]


@pytest.mark.parametrize("n,replicas,seed,epoch", GRID)
@pytest.mark.parametrize("shuffle,drop_last", [(True, False), (True, True), (False, False), (False, True)])
def test_indices_match_torch(n, replicas, seed, epoch, shuffle, drop_last):
    ranks = range(replicas) if n < 100_000 else [0, replicas - 1]
    for rank in ranks:
        expected = torch_indices(n, replicas, rank, seed, epoch, shuffle, drop_last)
        got = muster_indices(n, replicas, rank, seed, epoch, int(shuffle), int(drop_last))
        assert got.shape == expected.shape, (rank, got.shape, expected.shape)
        assert np.array_equal(got, expected), rank


@pytest.mark.parametrize("n,seed", [(0, 0), (1, 3), (2, 0), (17, 2**32 + 5), (100_000, 123456789)])
def test_randperm_matches_torch(n, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    expected = torch.randperm(n, generator=g).numpy().astype("<i8")
    got = muster_indices("--randperm", n, seed)
    assert np.array_equal(got, expected)


def test_randperm_above_the_64_bit_threshold_matches_torch(tmp_path):
    # From n = 214,748,364 (UINT32_MAX / 20) on, torch draws 64-bit numbers in
    # an inside-out shuffle; 1.7 GB per side, checked once at the threshold.
    n, seed = 214_748_364, 7
    g = torch.Generator()
    g.manual_seed(seed)
    expected = torch.randperm(n, generator=g).numpy()
    out = tmp_path / "perm.bin"
    subprocess.run([TOOL, str(out), "--randperm", str(n), str(seed)], check=True, timeout=900)
    got = np.memmap(out, dtype="<i8", mode="r")
    assert got.shape == expected.shape
    assert np.array_equal(got, expected)
