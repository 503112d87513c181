#include "launch/crash_report.h"

#include <execinfo.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "mp/config.h"

extern char** environ;

namespace mp {
namespace {

// Note [Crash reports] in launch/crash_report.h. Everything below the
// install function runs in a signal handler: static buffers, no allocation.

constexpr int kMaxThreads = 128;
constexpr int kMaxFrames = 48;
constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr int64_t kThreadWaitNs = 1'000'000'000;    // the other threads' time to answer, in all
constexpr int64_t kSymbolizeWaitNs = 20'000'000'000;  // one addr2line run, at most

struct ThreadStack {
  std::atomic<int> done{0};
  pid_t tid = 0;
  int frames = 0;
  void* pc[kMaxFrames] = {};
  const char* symbol[kMaxFrames] = {};  // into g_symbols; null: not symbolized
  int symbol_len[kMaxFrames] = {};
};

// Set by install_crash_report, read by the handlers.
char g_path[4096];
char g_label[256];
char g_altstack[64 * 1024];
// Filled in the handlers.
ThreadStack g_stacks[kMaxThreads];
std::atomic<int> g_slots{0};
std::atomic<pid_t> g_reporter{0};
char g_maps[1 << 20];
char g_symbols[4 << 20];
size_t g_symbols_used = 0;

pid_t this_tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }
int dump_signal() { return SIGRTMIN + 5; }

int64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

void nap() {
  const timespec t{0, 1'000'000};
  nanosleep(&t, nullptr);
}

// ---- output: stderr and the report file --------------------------------------

// `v` in `base` at the end of buf[0, 24), with "0x" for 16; returns its start.
char* format_number(uint64_t v, int base, char (&buf)[24]) {
  char* p = buf + sizeof(buf) - 1;
  *p = '\0';
  do {
    *--p = "0123456789abcdef"[v % base];
    v /= base;
  } while (v != 0);
  if (base == 16) {
    *--p = 'x';
    *--p = '0';
  }
  return p;
}

struct Out {
  int fds[2] = {2, -1};
  void put(const char* s, size_t n) const {
    for (int fd : fds) {
      if (fd < 0) continue;
      for (size_t done = 0; done < n;) {
        const ssize_t w = write(fd, s + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += static_cast<size_t>(w);
      }
    }
  }
  void put(const char* s) const { put(s, std::strlen(s)); }
  void num(uint64_t v, int base = 10) const;
};

void Out::num(uint64_t v, int base) const {
  char buf[24];
  put(format_number(v, base, buf));
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
  }
  return "signal";
}

// The contents of a small /proc file, NUL-terminated (empty on failure).
size_t read_file(const char* path, char* buf, size_t cap) {
  size_t n = 0;
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    buf[0] = '\0';
    return 0;
  }
  for (ssize_t r; n + 1 < cap && ((r = read(fd, buf + n, cap - 1 - n)) > 0 || (r < 0 && errno == EINTR));) {
    if (r > 0) n += static_cast<size_t>(r);
  }
  close(fd);
  buf[n] = '\0';
  return n;
}

void put_thread_name(const Out& out, pid_t tid) {
  char path[64] = "/proc/self/task/";
  char digits[24];
  std::strcat(path, format_number(static_cast<uint64_t>(tid), 10, digits));
  std::strcat(path, "/comm");
  char name[64];
  size_t n = read_file(path, name, sizeof(name));
  while (n > 0 && name[n - 1] == '\n') --n;
  out.put(" \"");
  out.put(name, n);
  out.put("\"");
}

// ---- the threads -----------------------------------------------------------------

// Every thread of the process but the caller gets a slot and kDumpSignal.
void ask_every_thread(pid_t me) {
  const int dir = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return;
  alignas(8) char buf[4096];
  for (long n; (n = syscall(SYS_getdents64, dir, buf, sizeof(buf))) > 0;) {
    for (long off = 0; off < n;) {
      const char* name = buf + off + 19;  // struct linux_dirent64: ino, off, reclen, type, name
      unsigned short reclen = 0;
      std::memcpy(&reclen, buf + off + 16, sizeof(reclen));
      off += reclen;
      pid_t tid = 0;
      for (const char* c = name; *c >= '0' && *c <= '9'; ++c) tid = tid * 10 + (*c - '0');
      if (tid == 0 || tid == me || g_slots.load() >= kMaxThreads) continue;
      ThreadStack& s = g_stacks[g_slots.load()];
      s.tid = tid;
      s.done.store(0);
      g_slots.fetch_add(1);
      syscall(SYS_tgkill, getpid(), tid, dump_signal());
    }
  }
  close(dir);
}

void wait_for_threads() {
  const int64_t deadline = now_ns() + kThreadWaitNs;
  for (int i = 1; i < g_slots.load(); ++i) {
    while (g_stacks[i].done.load(std::memory_order_acquire) == 0 && now_ns() < deadline) nap();
  }
}

extern "C" void on_dump_signal(int, siginfo_t*, void*) {
  const int saved = errno;
  const pid_t me = this_tid();
  for (int i = 1; i < g_slots.load(); ++i) {
    ThreadStack& s = g_stacks[i];
    if (s.tid != me || s.done.load() != 0) continue;
    s.frames = backtrace(s.pc, kMaxFrames);
    s.done.store(1, std::memory_order_release);
  }
  errno = saved;
}

// ---- symbols: addr2line per module --------------------------------------------

struct Module {
  uintptr_t start = 0, end = 0, offset = 0;
  const char* path = nullptr;
};
constexpr int kMaxModules = 4096;
Module g_modules[kMaxModules];
int g_module_count = 0;

uintptr_t parse_hex(const char*& p) {
  uintptr_t v = 0;
  for (;; ++p) {
    const char c = *p;
    if (c >= '0' && c <= '9') v = v * 16 + (c - '0');
    else if (c >= 'a' && c <= 'f') v = v * 16 + (c - 'a' + 10);
    else return v;
  }
}

// Executable mappings of files, from /proc/self/maps ("start-end perms offset dev inode path").
void read_modules() {
  read_file("/proc/self/maps", g_maps, sizeof(g_maps));
  g_module_count = 0;
  for (char* line = g_maps; *line != '\0' && g_module_count < kMaxModules;) {
    char* eol = std::strchr(line, '\n');
    if (eol != nullptr) *eol = '\0';
    const char* p = line;
    Module m;
    m.start = parse_hex(p);
    m.end = parse_hex(++p);
    const bool exec = std::strlen(p) > 4 && p[3] == 'x';
    p += 6;
    m.offset = parse_hex(p);
    const char* path = std::strchr(p, '/');
    if (exec && path != nullptr) {
      m.path = path;
      g_modules[g_module_count++] = m;
    }
    if (eol == nullptr) break;
    line = eol + 1;
  }
}

const Module* module_of(uintptr_t pc) {
  for (int i = 0; i < g_module_count; ++i) {
    if (pc >= g_modules[i].start && pc < g_modules[i].end) return &g_modules[i];
  }
  return nullptr;
}

// The address addr2line takes for frame `f` (a return address, but for a
// crashing thread's first frames: the call's last byte, so the call's line).
uintptr_t file_address(const Module& m, const ThreadStack& s, int f) {
  const auto pc = reinterpret_cast<uintptr_t>(s.pc[f]);
  return pc - m.start + m.offset - (f > 0 ? 1 : 0);
}

const char* addr2line_path() {
  for (const char* p : {"/usr/bin/addr2line", "/bin/addr2line", "/usr/local/bin/addr2line"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return nullptr;
}

// Runs `argv` with stdout into g_symbols; returns the bytes it wrote (the
// child is killed at the deadline).
size_t run_child(const char* program, char* const argv[]) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return 0;
  const pid_t child = _Fork();
  if (child == 0) {
    dup2(fds[1], 1);
    const int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 2);
    execve(program, argv, environ);
    _exit(127);
  }
  close(fds[1]);
  size_t n = 0;
  const int64_t deadline = now_ns() + kSymbolizeWaitNs;
  while (child > 0 && g_symbols_used + n + 1 < sizeof(g_symbols)) {
    const int64_t left_ms = (deadline - now_ns()) / 1'000'000;
    pollfd p{fds[0], POLLIN, 0};
    if (left_ms <= 0 || poll(&p, 1, static_cast<int>(left_ms)) == 0) break;
    const ssize_t r = read(fds[0], g_symbols + g_symbols_used + n, sizeof(g_symbols) - 1 - g_symbols_used - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += static_cast<size_t>(r);
  }
  close(fds[0]);
  if (child > 0) {
    kill(child, SIGKILL);
    while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  return n;
}

// addr2line's lines for the frames in `m`, in order; each frame's first line
// and its " (inlined by)" lines become its symbol.
void symbolize_module(const char* program, const Module& m) {
  static char hex[kMaxThreads * kMaxFrames][24];
  static char* argv[kMaxThreads * kMaxFrames + 8];
  static int16_t which[kMaxThreads * kMaxFrames][2];
  int argc = 0, n = 0;
  for (const char* a : {"addr2line", "-C", "-f", "-i", "-p", "-e"}) argv[argc++] = const_cast<char*>(a);
  argv[argc++] = const_cast<char*>(m.path);
  for (int t = 0; t < g_slots.load(); ++t) {
    ThreadStack& s = g_stacks[t];
    for (int f = 0; f < s.frames; ++f) {
      const Module* own = module_of(reinterpret_cast<uintptr_t>(s.pc[f]));
      if (own == nullptr || std::strcmp(own->path, m.path) != 0 || s.symbol[f] != nullptr) continue;
      argv[argc++] = format_number(file_address(*own, s, f), 16, hex[n]);
      which[n][0] = static_cast<int16_t>(t);
      which[n][1] = static_cast<int16_t>(f);
      ++n;
    }
  }
  if (n == 0) return;
  argv[argc] = nullptr;
  char* text = g_symbols + g_symbols_used;
  const size_t len = run_child(program, argv);
  text[len] = '\0';
  g_symbols_used += len + 1;
  int k = -1;
  for (char* line = text; *line != '\0';) {
    char* eol = std::strchr(line, '\n');
    const size_t line_len = eol != nullptr ? static_cast<size_t>(eol - line) : std::strlen(line);
    if (std::strncmp(line, " (inlined by)", 13) != 0 && ++k >= n) break;
    if (k >= 0) {
      ThreadStack& s = g_stacks[which[k][0]];
      const int f = which[k][1];
      if (s.symbol[f] == nullptr) s.symbol[f] = line;
      s.symbol_len[f] = static_cast<int>(line + line_len - s.symbol[f]);
    }
    if (eol == nullptr) break;
    line = eol + 1;
  }
}

void symbolize() {
  read_modules();
  const char* program = addr2line_path();
  if (program == nullptr) return;
  for (int i = 0; i < g_module_count; ++i) {
    bool first = true;  // one run per file, however many mappings it has
    for (int j = 0; j < i; ++j) first = first && std::strcmp(g_modules[j].path, g_modules[i].path) != 0;
    if (first) symbolize_module(program, g_modules[i]);
  }
}

// ---- the report ------------------------------------------------------------------

void put_frames(const Out& out, const ThreadStack& s) {
  for (int f = 0; f < s.frames; ++f) {
    out.put("  #");
    out.num(static_cast<uint64_t>(f));
    out.put(" ");
    if (s.symbol[f] != nullptr) {
      out.put(s.symbol[f], static_cast<size_t>(s.symbol_len[f]));
      out.put("  ");
    }
    const auto pc = reinterpret_cast<uintptr_t>(s.pc[f]);
    out.put("[");
    if (const Module* m = module_of(pc)) {
      const char* base = std::strrchr(m->path, '/');
      out.put(base != nullptr ? base + 1 : m->path);
      out.put("+");
      out.num(pc - m->start + m->offset, 16);
    } else {
      out.num(pc, 16);
    }
    out.put("]\n");
  }
}

uintptr_t fault_pc(const void* context) {
  const auto* uc = static_cast<const ucontext_t*>(context);
#if defined(__x86_64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return 0;
#endif
}

void write_report(int sig, const siginfo_t* info, const void* context) {
  Out out;
  if (g_path[0] != '\0') out.fds[1] = open(g_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  out.put("=== crash report: ");
  out.put(g_label);
  out.put(" ===\nsignal ");
  out.put(signal_name(sig));
  out.put(" (");
  out.num(static_cast<uint64_t>(sig));
  out.put("), code ");
  out.num(static_cast<uint64_t>(static_cast<uint32_t>(info->si_code)));
  out.put(", address ");
  out.num(reinterpret_cast<uintptr_t>(info->si_addr), 16);
  out.put(", pc ");
  out.num(fault_pc(context), 16);
  out.put(", process ");
  out.num(static_cast<uint64_t>(getpid()));
  out.put("\n");
  for (int i = 0; i < g_slots.load(); ++i) {
    const ThreadStack& s = g_stacks[i];
    out.put("thread ");
    out.num(static_cast<uint64_t>(s.tid));
    put_thread_name(out, s.tid);
    if (i == 0) out.put(" (took the signal)");
    if (i > 0 && s.done.load(std::memory_order_acquire) == 0) {
      out.put(": no stack (it did not answer within 1 s; the signal may be blocked there)\n");
      continue;
    }
    out.put(":\n");
    put_frames(out, s);
  }
  out.put("=== end of crash report ===\n");
  if (out.fds[1] >= 0) close(out.fds[1]);
}

void restore_defaults() {
  for (int sig : kCrashSignals) signal(sig, SIG_DFL);
}

extern "C" void on_crash_signal(int sig, siginfo_t* info, void* context) {
  const pid_t me = this_tid();
  pid_t none = 0;
  if (!g_reporter.compare_exchange_strong(none, me)) {
    if (none == me) {  // the report itself failed: die as the first signal would have
      restore_defaults();
      raise(sig);
      return;
    }
    for (;;) pause();  // another thread is reporting and will end the process
  }
  ThreadStack& mine = g_stacks[0];
  mine.tid = me;
  mine.frames = backtrace(mine.pc, kMaxFrames);
  mine.done.store(1);
  g_slots.store(1);
  ask_every_thread(me);
  wait_for_threads();
  symbolize();
  write_report(sig, info, context);
  restore_defaults();
  raise(sig);  // pending until this handler returns: then the default action
}

void copy_bounded(char* dst, size_t cap, const std::string& s) {
  const size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

}  // namespace

void install_worker_crash_report(const std::string& out_dir, int rank) {
  const std::string r = std::to_string(rank);
  install_crash_report(out_dir.empty() ? "" : out_dir + "/crash.rank" + r + ".txt", "mp_worker rank " + r);
}

void install_crash_report(const std::string& path, const std::string& label) {
  copy_bounded(g_path, sizeof(g_path), path);
  copy_bounded(g_label, sizeof(g_label), label);
  if constexpr (MP_SANITIZE) return;  // the sanitizer's own report
  void* warm[2];
  backtrace(warm, 2);  // loads the unwinder now, not in a handler
  stack_t alt{};
  alt.ss_sp = g_altstack;
  alt.ss_size = sizeof(g_altstack);
  if (sigaltstack(&alt, nullptr) != 0) MP_THROW(IoError, "crash report: sigaltstack failed: ", std::strerror(errno));
  struct sigaction sa {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sa.sa_sigaction = on_crash_signal;
  for (int sig : kCrashSignals) {
    if (sigaction(sig, &sa, nullptr) != 0) {
      MP_THROW(IoError, "crash report: sigaction(", signal_name(sig), ") failed: ", std::strerror(errno));
    }
  }
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sa.sa_sigaction = on_dump_signal;
  if (sigaction(dump_signal(), &sa, nullptr) != 0) {
    MP_THROW(IoError, "crash report: sigaction(SIGRTMIN+5) failed: ", std::strerror(errno));
  }
}

}  // namespace mp
