// The check on heap_trap itself: forks; the child allocates and exits 0. Run
// with heap_trap preloaded, the child ends with the trap's code instead.
// Prints the child's exit code.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

int main() {
  pid_t child = fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  if (child == 0) {
    auto text = std::make_unique<std::string>(1000, 'x');
    _exit(text->size() == 1000 ? 0 : 1);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) {
    std::perror("waitpid");
    return 1;
  }
  std::printf("%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}
