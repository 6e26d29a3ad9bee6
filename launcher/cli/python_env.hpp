// Which Python runs the workers when neither PYTHON_EXEC nor --no-python says:
// the interpreter of the Python environment muster itself was installed into
// (pip puts the wheel's binaries in <env>/bin), as torchrun runs workers with
// the interpreter that runs it. docs/python.md has the rules.
#pragma once

#include <string>

namespace muster::launcher {

// For the agent binary at exe (its real path): <dir>/python3 (or python) when
// <dir>'s parent is a venv or virtualenv (pyvenv.cfg) or a conda environment
// (conda-meta/), and not an application's private environment (pipx's
// pipx_metadata.json, uv's uv-receipt.toml: it holds muster, not the training
// code's packages); "" otherwise. The interpreter's path is the environment's
// own, not resolved through its symlink, so it finds the environment's packages.
std::string environment_python_of(const std::string& exe);

}  // namespace muster::launcher
