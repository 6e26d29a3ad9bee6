// A duration as muster's logs, reports and refusals write it: whole seconds
// as "15 s", the rest with the milliseconds that matter ("1.5 s", "0.25 s").
#pragma once

#include <chrono>
#include <string>

namespace muster {

std::string seconds_text(std::chrono::milliseconds d);

}  // namespace muster
