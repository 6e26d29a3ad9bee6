// The release (the CMake project version) and the git revision it was built
// from; every binary's --version prints version_string().
#pragma once

namespace muster {

const char* version_number();   // "0.1.0"
const char* git_revision();     // "8af0b51c2d3e", "...-dirty", or "unknown"
const char* version_string();   // "0.1.0 (git 8af0b51c2d3e)"

}  // namespace muster
