#include "cuda_devices.hpp"

#include <dlfcn.h>

#include "numa_binding.hpp"

namespace muster::launcher {

namespace {

// The few driver API entry points needed, by their C signatures (cuda.h);
// CUdevice is an int, CUresult an enum the size of an int.
using CuInit = int (*)(unsigned int flags);
using CuDeviceGetCount = int (*)(int* count);
using CuDeviceGet = int (*)(int* device, int ordinal);
using CuDeviceGetPciBusId = int (*)(char* bus_id, int len, int device);
using CuGetErrorString = int (*)(int error, const char** text);

constexpr int kCudaSuccess = 0;
constexpr int kCudaErrorNoDevice = 100;
// "dddddddd:bb:dd.f" and its terminator, with room to spare.
constexpr int kPciBusIdLength = 64;

}  // namespace

Result<std::vector<std::string>> cuda_pci_addresses() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return Status(Code::not_found, std::string("--numa-binding needs an NVIDIA GPU and its driver, and the CUDA "
                                               "driver library cannot be loaded (") +
                                       (why != nullptr ? why : "libcuda.so.1 not found") +
                                       "); install the NVIDIA driver or drop --numa-binding");
  }
  auto init = reinterpret_cast<CuInit>(dlsym(lib, "cuInit"));
  auto count_fn = reinterpret_cast<CuDeviceGetCount>(dlsym(lib, "cuDeviceGetCount"));
  auto get = reinterpret_cast<CuDeviceGet>(dlsym(lib, "cuDeviceGet"));
  auto bus_id = reinterpret_cast<CuDeviceGetPciBusId>(dlsym(lib, "cuDeviceGetPCIBusId"));
  auto error_string = reinterpret_cast<CuGetErrorString>(dlsym(lib, "cuGetErrorString"));
  if (init == nullptr || count_fn == nullptr || get == nullptr || bus_id == nullptr) {
    dlclose(lib);
    return Status(Code::not_found, "the CUDA driver library libcuda.so.1 lacks cuInit, cuDeviceGetCount, "
                                   "cuDeviceGet or cuDeviceGetPCIBusId; update the NVIDIA driver");
  }
  auto failed = [&](const char* call, int rc) {
    const char* text = nullptr;
    if (error_string == nullptr || error_string(rc, &text) != kCudaSuccess || text == nullptr) text = "unknown error";
    return Status(Code::unavailable, std::string("--numa-binding: the CUDA driver's ") + call + " failed (error " +
                                         std::to_string(rc) + ": " + text +
                                         "); check the GPUs with nvidia-smi, or drop --numa-binding");
  };
  int rc = init(0);
  int count = 0;
  if (rc == kCudaErrorNoDevice) return std::vector<std::string>{};
  if (rc != kCudaSuccess) return failed("cuInit", rc);
  if ((rc = count_fn(&count)) != kCudaSuccess) return failed("cuDeviceGetCount", rc);
  std::vector<std::string> addresses;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    int device = 0;
    if ((rc = get(&device, ordinal)) != kCudaSuccess) return failed("cuDeviceGet", rc);
    char text[kPciBusIdLength] = {};
    if ((rc = bus_id(text, kPciBusIdLength - 1, device)) != kCudaSuccess) return failed("cuDeviceGetPCIBusId", rc);
    auto address = numa::normalize_pci_address(text);
    if (!address.ok()) {
      return Status(Code::internal, "the CUDA driver gave cuda:" + std::to_string(ordinal) +
                                        " a PCI address muster cannot read: " + address.status().message());
    }
    addresses.push_back(std::move(address.value()));
  }
  return addresses;
}

}  // namespace muster::launcher
