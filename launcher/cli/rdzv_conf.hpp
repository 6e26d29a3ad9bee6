// --rdzv-conf "k1=v1,k2=v2": torchrun's parsing rules and error texts.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "muster/common/status.hpp"

namespace muster::launcher {

using RdzvConf = std::map<std::string, std::string>;

Result<RdzvConf> parse_rdzv_conf(std::string_view text);

// 1,true,t,yes,y / 0,false,f,no,n, any case; `fallback` when the key is absent.
Result<bool> rdzv_conf_bool(const RdzvConf& conf, const std::string& key, bool fallback);
// A Python int(); `fallback` when the key is absent.
Result<long long> rdzv_conf_int(const RdzvConf& conf, const std::string& key, long long fallback);

}  // namespace muster::launcher
