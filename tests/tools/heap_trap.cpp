// Preloaded (LD_PRELOAD) into muster by a test: a heap call in the child of a
// fork(), before that child execs, ends the child at once with exit code 86
// and a line on stderr. The agent is multi-threaded, so a lock another thread
// held at the fork (the heap's, a sanitizer's) is never released in the
// child: code there that allocates can hang for ever. This makes every such
// call fail at once instead of once in a thousand runs.
//
// A plain build replaces malloc and its family, passing calls on to glibc's
// __libc_* entry points. A sanitized build cannot (the sanitizer owns the
// heap), so it installs the sanitizer's allocation hooks instead; the test
// sets verify_asan_link_order=0 for that build, as this library is loaded
// before the sanitizer's runtime.
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace {

constexpr int kTrapExitCode = 86;
volatile int in_forked_child = 0;

void on_fork_child() { in_forked_child = 1; }

[[noreturn]] void trap(const char* what) {
  static constexpr char kPrefix[] = "heap_trap: ";
  static constexpr char kSuffix[] = " in a forked child before exec\n";
  ssize_t ignored = write(STDERR_FILENO, kPrefix, sizeof kPrefix - 1);
  std::size_t len = 0;
  while (what[len] != '\0') ++len;
  ignored = write(STDERR_FILENO, what, len);
  ignored = write(STDERR_FILENO, kSuffix, sizeof kSuffix - 1);
  (void)ignored;
  _exit(kTrapExitCode);
}

__attribute__((constructor)) void install_fork_handler() { pthread_atfork(nullptr, nullptr, on_fork_child); }

}  // namespace

#if defined(__SANITIZE_ADDRESS__)

extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*, std::size_t),
                                                         void (*free_hook)(const volatile void*));

namespace {

void on_malloc(const volatile void*, std::size_t) {
  if (in_forked_child) trap("an allocation");
}

void on_free(const volatile void*) {
  if (in_forked_child) trap("a free");
}

__attribute__((constructor)) void install_heap_hooks() {
  if (__sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) == 0) {
    // Not installed (the sanitizer's table of hooks is full): a trap that
    // catches nothing must not let a test pass.
    static constexpr char kMsg[] = "heap_trap: cannot install the sanitizer's allocation hooks\n";
    ssize_t ignored = write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    (void)ignored;
    _exit(kTrapExitCode + 1);
  }
}

}  // namespace

#else

extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void* __libc_valloc(std::size_t);
void* __libc_pvalloc(std::size_t);
void __libc_free(void*);

void* malloc(std::size_t n) {
  if (in_forked_child) trap("malloc");
  return __libc_malloc(n);
}

void* calloc(std::size_t count, std::size_t size) {
  if (in_forked_child) trap("calloc");
  return __libc_calloc(count, size);
}

void* realloc(void* p, std::size_t n) {
  if (in_forked_child) trap("realloc");
  return __libc_realloc(p, n);
}

void free(void* p) {
  if (in_forked_child && p != nullptr) trap("free");
  __libc_free(p);
}

void* memalign(std::size_t alignment, std::size_t n) {
  if (in_forked_child) trap("memalign");
  return __libc_memalign(alignment, n);
}

// glibc 2.36's aligned_alloc is its memalign.
void* aligned_alloc(std::size_t alignment, std::size_t n) {
  if (in_forked_child) trap("aligned_alloc");
  return __libc_memalign(alignment, n);
}

int posix_memalign(void** out, std::size_t alignment, std::size_t n) {
  if (in_forked_child) trap("posix_memalign");
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return EINVAL;
  int saved = errno;  // posix_memalign reports through its result, never errno
  void* p = __libc_memalign(alignment, n);
  errno = saved;
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

void* valloc(std::size_t n) {
  if (in_forked_child) trap("valloc");
  return __libc_valloc(n);
}

void* pvalloc(std::size_t n) {
  if (in_forked_child) trap("pvalloc");
  return __libc_pvalloc(n);
}
}

#endif
