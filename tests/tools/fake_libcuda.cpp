// A stand-in for the CUDA driver library, built as libcuda.so.1 in its own
// folder, so that the --numa-binding tests can give muster GPUs on a machine
// that has none: a test puts the folder on LD_LIBRARY_PATH, and muster's
// dlopen("libcuda.so.1") finds this one. It serves the calls muster makes.
//
// MUSTER_FAKE_CUDA_PCI: the machine's GPUs, by PCI address, comma-separated,
// in the driver's order ("" or unset: no GPU, as cuInit's
// CUDA_ERROR_NO_DEVICE). CUDA_VISIBLE_DEVICES is applied as the driver does
// for indices: the listed GPUs in the listed order, up to the first entry
// that is not a valid index. The addresses are returned in the driver's long
// form ("00000000:18:00.0", upper case), which muster must normalize.
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;
constexpr int kNotInitialized = 3;
constexpr int kNoDevice = 100;
constexpr int kInvalidDevice = 101;

bool initialized = false;
std::vector<std::string> visible;

std::vector<std::string> split(const char* text) {
  std::vector<std::string> out;
  std::string item;
  for (const char* p = text; ; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!item.empty()) out.push_back(item);
      item.clear();
      if (*p == '\0') break;
    } else if (*p != ' ') {
      item += *p;
    }
  }
  return out;
}

}  // namespace

extern "C" {

int cuInit(unsigned int flags) {
  if (flags != 0) return kInvalidValue;
  const char* all_text = std::getenv("MUSTER_FAKE_CUDA_PCI");
  std::vector<std::string> all = split(all_text != nullptr ? all_text : "");
  visible = all;
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) {
    visible.clear();
    for (const auto& item : split(cvd)) {
      char* end = nullptr;
      long index = std::strtol(item.c_str(), &end, 10);
      if (*end != '\0' || index < 0 || index >= static_cast<long>(all.size())) break;
      visible.push_back(all[static_cast<std::size_t>(index)]);
    }
  }
  if (visible.empty()) return kNoDevice;
  initialized = true;
  return kSuccess;
}

int cuDeviceGetCount(int* count) {
  if (!initialized) return kNotInitialized;
  *count = static_cast<int>(visible.size());
  return kSuccess;
}

int cuDeviceGet(int* device, int ordinal) {
  if (!initialized) return kNotInitialized;
  if (ordinal < 0 || ordinal >= static_cast<int>(visible.size())) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

int cuDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (!initialized) return kNotInitialized;
  if (device < 0 || device >= static_cast<int>(visible.size())) return kInvalidDevice;
  std::string text = "0000" + visible[static_cast<std::size_t>(device)];
  for (auto& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (len <= static_cast<int>(text.size())) return kInvalidValue;
  std::memcpy(bus_id, text.c_str(), text.size() + 1);
  return kSuccess;
}

int cuGetErrorString(int error, const char** text) {
  *text = error == kNoDevice ? "no CUDA-capable device is detected" : "fake driver error";
  return kSuccess;
}

}  // extern "C"
