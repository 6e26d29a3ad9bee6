// The GPUs this process sees, as CUDA numbers them: the driver library
// (libcuda.so.1) is loaded at run time, never linked, so muster builds and
// runs without CUDA, and asks the driver only when --numa-binding needs it.
//
// Contract. cuda_pci_addresses() returns the PCI address of cuda:0, cuda:1, ...
// in the order the CUDA driver numbers them for this process: after
// CUDA_VISIBLE_DEVICES (indices, UUIDs, MIG instances) and CUDA_DEVICE_ORDER
// (FASTEST_FIRST by default), which the driver applies itself, exactly as
// torch.cuda in a torchrun agent sees them. Addresses are in torch's form
// ("0000:18:00.0"). An error says what is missing and what to do. The driver
// library stays loaded (unloading a CUDA driver is not supported).
#pragma once

#include <string>
#include <vector>

#include "muster/common/status.hpp"

namespace muster::launcher {

Result<std::vector<std::string>> cuda_pci_addresses();

}  // namespace muster::launcher
