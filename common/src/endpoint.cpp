#include "muster/common/endpoint.hpp"

#include <cctype>

namespace muster {

std::string Endpoint::to_string() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return port < 0 ? h : h + ":" + std::to_string(port);
}

namespace {

bool valid_host(std::string_view host) {
  if (host.empty()) return false;
  for (char c : host) {
    auto u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || c == '_' || c == '.' || c == ':' || c == '-')) return false;
  }
  return true;
}

}  // namespace

Result<Endpoint> parse_endpoint(std::string_view text, int default_port) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  if (text.empty()) return Endpoint{"localhost", default_port};

  std::string_view host = text;
  std::string_view port;
  bool has_port = false;
  if (text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos) {
      return invalid_argument("the endpoint '" + std::string(text) +
                              "' has an unclosed '[': write IPv6 hosts as [addr]:port");
    }
    host = text.substr(1, close - 1);
    auto rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') {
        return invalid_argument("the endpoint '" + std::string(text) + "' is not in [host]:port form");
      }
      port = rest.substr(1);
      has_port = true;
    }
  } else {
    auto colon = text.rfind(':');
    if (colon != std::string_view::npos && text.find(':') == colon) {
      host = text.substr(0, colon);
      port = text.substr(colon + 1);
      has_port = true;
    } else if (colon != std::string_view::npos) {
      // A bare IPv6 address without brackets and without a port.
      host = text;
    }
  }
  if (!valid_host(host)) {
    return invalid_argument("the hostname of the endpoint '" + std::string(text) +
                            "' is not valid: use letters, digits, '.', '-', '_' or an IP address");
  }
  Endpoint ep{std::string(host), default_port};
  if (has_port) {
    bool digits = !port.empty() && port.size() <= 5;
    for (char c : port) digits = digits && std::isdigit(static_cast<unsigned char>(c));
    int value = digits ? std::stoi(std::string(port)) : -1;
    if (!digits || value > 65535) {
      return invalid_argument("the port number of the endpoint '" + std::string(text) +
                              "' must be an integer between 0 and 65535");
    }
    ep.port = value;
  }
  return ep;
}

}  // namespace muster
