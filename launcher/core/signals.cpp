#include "signals.hpp"

#include <csignal>
#include <string>
#include <utility>

namespace muster::launcher {
namespace {

constexpr std::pair<int, const char*> kSignals[] = {
    {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},       {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
    {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},     {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
    {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},     {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},     {SIGTERM, "SIGTERM"}, {SIGSTKFLT, "SIGSTKFLT"},
    {SIGCHLD, "SIGCHLD"}, {SIGCONT, "SIGCONT"},     {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"},
    {SIGTTIN, "SIGTTIN"}, {SIGTTOU, "SIGTTOU"},     {SIGURG, "SIGURG"},   {SIGXCPU, "SIGXCPU"},
    {SIGXFSZ, "SIGXFSZ"}, {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"},
    {SIGIO, "SIGIO"},     {SIGPWR, "SIGPWR"},       {SIGSYS, "SIGSYS"},
};

}  // namespace

std::string signal_name(int signo) {
  for (const auto& [number, name] : kSignals) {
    if (number == signo) return name;
  }
  if (signo >= SIGRTMIN && signo <= SIGRTMAX) {
    if (signo == SIGRTMIN) return "SIGRTMIN";
    if (signo == SIGRTMAX) return "SIGRTMAX";
  }
  return {};
}

std::optional<int> signal_from_name(std::string_view name) {
  for (const auto& [number, known] : kSignals) {
    if (name == known) return number;
  }
  if (name == "SIGIOT") return SIGABRT;
  if (name == "SIGPOLL") return SIGIO;
  if (name == "SIGCLD") return SIGCHLD;
  return std::nullopt;
}

}  // namespace muster::launcher
