// Worker used by bench/launch to time restarts. On start it appends
// "start <CLOCK_MONOTONIC ns>" to the file in $1, then, while
// TORCHELASTIC_RESTART_COUNT < $2, appends "exit <ns>" and exits 1; the last
// attempt exits 0.
#include <time.h>

#include <cstdio>
#include <cstdlib>

namespace {

long long now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: restart_probe FILE FAILURES\n");
    return 2;
  }
  long long started = now_ns();
  const char* rc = std::getenv("TORCHELASTIC_RESTART_COUNT");
  int restart = rc ? std::atoi(rc) : 0;
  int failures = std::atoi(argv[2]);
  FILE* f = std::fopen(argv[1], "a");
  if (!f) return 3;
  std::fprintf(f, "start %lld\n", started);
  if (restart < failures) {
    std::fprintf(f, "exit %lld\n", now_ns());
    std::fclose(f);
    return 1;
  }
  std::fclose(f);
  return 0;
}
