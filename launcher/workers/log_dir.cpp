#include "log_dir.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "muster/common/random.hpp"

namespace muster::launcher {
namespace fs = std::filesystem;

Result<std::string> make_unique_dir(const std::string& parent, const std::string& prefix) {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789_";
  for (int attempt = 0; attempt < 100; ++attempt) {
    unsigned char bytes[8];
    if (auto st = random_bytes(bytes, sizeof bytes); !st.ok()) return st;
    std::string name = prefix;
    for (unsigned char b : bytes) name.push_back(kChars[b % (sizeof kChars - 1)]);
    std::string path = (fs::path(parent) / name).string();
    if (::mkdir(path.c_str(), 0700) == 0) return path;
    if (errno != EEXIST) {
      return io_error("cannot create the directory " + path + ": " + std::strerror(errno));
    }
  }
  return io_error("cannot find an unused directory name under " + parent);
}

Result<LogDirectory> LogDirectory::create(const std::optional<std::string>& base, const std::string& run_id,
                                          const std::string& tmpdir) {
  LogDirectory d;
  if (base && *base == "/dev/null") {
    d.disabled_ = true;
    return d;
  }
  std::string root;
  if (base) {
    std::error_code ec;
    if (fs::exists(*base, ec) && !fs::is_directory(*base, ec)) {
      return invalid_argument("log_dir: " + *base + " is a file; give --log-dir a directory");
    }
    fs::create_directories(*base, ec);
    if (ec) return io_error("cannot create the log directory " + *base + ": " + ec.message());
    root = *base;
  } else {
    auto made = make_unique_dir(tmpdir.empty() ? "/tmp" : tmpdir, "torchelastic_");
    if (!made.ok()) return made.status();
    root = made.value();
  }
  auto run = make_unique_dir(root, run_id + "_");
  if (!run.ok()) return run.status();
  d.run_dir_ = run.value();
  return d;
}

Result<std::string> LogDirectory::prepare_attempt(int restart_count, int nproc) {
  if (disabled_) return std::string();
  std::string attempt = (fs::path(run_dir_) / ("attempt_" + std::to_string(restart_count))).string();
  std::error_code ec;
  fs::remove_all(attempt, ec);
  for (int r = 0; r < nproc; ++r) {
    fs::create_directories(rank_dir(attempt, r), ec);
    if (ec) return io_error("cannot create " + rank_dir(attempt, r) + ": " + ec.message());
  }
  if (nproc == 0) fs::create_directories(attempt, ec);
  return attempt;
}

std::string LogDirectory::rank_dir(const std::string& attempt_dir, int local_rank) const {
  return (fs::path(attempt_dir) / std::to_string(local_rank)).string();
}

}  // namespace muster::launcher
