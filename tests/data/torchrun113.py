"""Debian's torch 1.13 torchrun with its Python 3.11 -r/-t parser mended.

On Python 3.11 `Std.from_str` maps "0" and "3" to None (iterating an IntFlag
yields only its single-bit members), which crashes every default launch. This
wrapper replaces that one parser in-process and then runs torchrun's main()."""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def from_str(vm):
    if re.fullmatch(r"[0123]", vm):
        return api.Std(int(vm))
    if re.fullmatch(r"(\d:[0123],)*(\d:[0123])", vm):
        return {int(k): api.Std(int(v)) for k, v in (item.split(":") for item in vm.split(","))}
    raise ValueError(f"{vm} does not match: <^[0123]$> or <^(\\d:[0123],)*(\\d:[0123])$>")


api.Std.from_str = staticmethod(from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
