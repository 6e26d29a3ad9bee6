#include "python_env.hpp"

#include <unistd.h>

#include <filesystem>
#include <system_error>

namespace muster::launcher {

std::string environment_python_of(const std::string& exe) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path bin = fs::path(exe).parent_path();
  fs::path env = bin.parent_path();
  if (bin.empty() || env.empty()) return "";
  bool is_env = fs::is_regular_file(env / "pyvenv.cfg", ec) || fs::is_directory(env / "conda-meta", ec);
  bool is_app = fs::exists(env / "pipx_metadata.json", ec) || fs::exists(env / "uv-receipt.toml", ec);
  if (!is_env || is_app) return "";
  for (const char* name : {"python3", "python"}) {
    fs::path python = bin / name;
    if (access(python.c_str(), X_OK) == 0) return python.string();
  }
  return "";
}

}  // namespace muster::launcher
