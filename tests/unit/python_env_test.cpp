#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "python_env.hpp"

using muster::launcher::environment_python_of;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "muster-pyenv-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void touch(const fs::path& p, bool executable = false) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "x";
  if (executable) chmod(p.c_str(), 0755);
}

}  // namespace

TEST_CASE("a venv's or conda environment's own interpreter runs the workers", "[python_env]") {
  TempDir t;
  auto venv = t.path / "venv";
  touch(venv / "pyvenv.cfg");
  touch(venv / "bin" / "muster", true);
  touch(venv / "bin" / "python3", true);
  CHECK(environment_python_of((venv / "bin" / "muster").string()) == (venv / "bin" / "python3").string());

  // A venv's python3 is usually a symlink: its own path is kept, not the target's.
  auto linked = t.path / "linked";
  touch(linked / "pyvenv.cfg");
  touch(linked / "bin" / "muster", true);
  fs::create_symlink("/usr/bin/env", linked / "bin" / "python3");
  CHECK(environment_python_of((linked / "bin" / "muster").string()) == (linked / "bin" / "python3").string());

  auto conda = t.path / "conda";
  fs::create_directories(conda / "conda-meta");
  touch(conda / "bin" / "python", true);  // only `python`
  CHECK(environment_python_of((conda / "bin" / "muster").string()) == (conda / "bin" / "python").string());
}

TEST_CASE("no environment, an application's private one or a broken interpreter: PATH decides", "[python_env]") {
  TempDir t;
  // Like /usr/bin: a python3 beside muster, but no environment around it.
  auto usr = t.path / "usr";
  touch(usr / "bin" / "python3", true);
  CHECK(environment_python_of((usr / "bin" / "muster").string()).empty());

  for (const char* marker : {"pipx_metadata.json", "uv-receipt.toml"}) {
    auto app = t.path / marker;
    touch(app / "pyvenv.cfg");
    touch(app / marker);
    touch(app / "bin" / "python3", true);
    CHECK(environment_python_of((app / "bin" / "muster").string()).empty());
  }

  auto broken = t.path / "broken";
  touch(broken / "pyvenv.cfg");
  fs::create_directories(broken / "bin");
  fs::create_symlink(t.path / "nowhere" / "python3", broken / "bin" / "python3");
  CHECK(environment_python_of((broken / "bin" / "muster").string()).empty());

  auto not_exec = t.path / "noexec";
  touch(not_exec / "pyvenv.cfg");
  touch(not_exec / "bin" / "python3", false);
  CHECK(environment_python_of((not_exec / "bin" / "muster").string()).empty());

  CHECK(environment_python_of("muster").empty());
  CHECK(environment_python_of("/muster").empty());
}
