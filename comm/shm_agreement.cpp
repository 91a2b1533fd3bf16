// ShmAgreement; see shm_agreement.h.
#include "comm/detail/shm_agreement.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "core/error.h"

namespace dtrain::comm {

namespace {

constexpr uint64_t kMagic = 0x6474726e61677231ULL;  // "dtrnagr1"
constexpr size_t kHeader = 64;
constexpr size_t kSlotBytes = 192;
// How long a rank polls for a peer's signature before it sleeps on the peer's futex: about what the peer
// needs when it is about to arrive (the usual case: the ranks issue the collective together).
constexpr auto kSpin = std::chrono::microseconds(50);
// A sleeping wait wakes at least this often to look at `stop`.
constexpr auto kSlice = std::chrono::milliseconds(50);

struct Header {
  uint64_t magic;
  uint64_t nonce;
  int64_t size;
};

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

size_t segment_bytes(int size) { return kHeader + kSlotBytes * static_cast<size_t>(size); }

// The PID namespace of this process (its inode under /proc/self/ns), 0 where it cannot be read.
uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// Process `pid`'s state letter and start time (clock ticks after boot) from /proc/<pid>/stat; false when
// there is no such process.
bool process_stat(int pid, char* state, uint64_t* start_time) {
  char path[48];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  // "pid (comm) S ppid ...": the name may hold spaces and parentheses, the fields after the last ')' cannot.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ') return false;
  *state = p[2];
  p += 3;
  for (int field = 4; field < 22 && p != nullptr; ++field) {  // start time is field 22
    p = std::strchr(p + 1, ' ');
  }
  *start_time = p != nullptr ? std::strtoull(p + 1, nullptr, 10) : 0;
  return true;
}

}  // namespace

struct ShmAgreement::Slot {
  std::atomic<uint64_t> seq;               // the last signed collective this rank published (0: none)
  std::atomic<uint32_t> futex;             // bumped at each publish; waiters sleep on it
  std::atomic<uint32_t> waiters;           // ranks sleeping on futex (the publisher wakes them only when > 0)
  int64_t signature[2][kSignatureFields];  // collective s in [s % 2]
  // Who owns the slot, written once before the group's set-up completes: its process, the start time that
  // tells it from a later process with the same pid, and the PID namespace the pid means something in.
  int64_t pid;
  uint64_t start_time;
  uint64_t pid_ns;
};
ShmAgreement::ShmAgreement(std::string name, uint64_t nonce, int rank, int size, void* base, size_t bytes)
    : name_(std::move(name)), nonce_(nonce), rank_(rank), size_(size), base_(base), bytes_(bytes) {
  static_assert(sizeof(Slot) <= kSlotBytes);
  static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free);
  sign_slot();
}

void ShmAgreement::sign_slot() {
  Slot& me = slot(rank_);
  char state = 0;
  uint64_t start = 0;
  me.pid = ::getpid();
  me.start_time = process_stat(::getpid(), &state, &start) ? start : 0;
  me.pid_ns = pid_namespace();
  // (read by the others only after the group's set-up all-reduce, which orders it)
}

bool ShmAgreement::exited(int r, int* pid) const {
  const Slot& peer = slot(r);
  if (pid) *pid = static_cast<int>(peer.pid);
  // (nothing is concluded where /proc could not be read, by the peer for itself or here)
  if (r == rank_ || peer.pid <= 0 || peer.start_time == 0 || peer.pid_ns == 0 ||
      peer.pid_ns != pid_namespace()) {
    return false;
  }
  char state = 0;
  uint64_t start = 0;
  if (!process_stat(static_cast<int>(peer.pid), &state, &start)) return true;       // gone, and reaped
  return state == 'Z' || state == 'X' || (start != 0 && start != peer.start_time);  // (0: not parsed)
}

ShmAgreement::~ShmAgreement() {
  if (rank_ == 0) unlink();
  ::munmap(base_, bytes_);
}

void ShmAgreement::unlink() {
  if (!linked_) return;
  linked_ = false;
  ::shm_unlink(name_.c_str());  // ENOENT when another rank removed it first
}

std::unique_ptr<ShmAgreement> ShmAgreement::create(int size, std::string* why) {
  std::random_device rd;
  const uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  char name[64];
  std::snprintf(name, sizeof(name), "/dtrain-agree-%d-%016llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(nonce));
  const size_t bytes = segment_bytes(size);
  int fd = ::shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    *why = str_cat("shm_open(", name, "): ", std::strerror(errno));
    return nullptr;
  }
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    *why = str_cat("ftruncate(", name, "): ", std::strerror(errno));
    ::close(fd);
    ::shm_unlink(name);
    return nullptr;
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    *why = str_cat("mmap(", name, "): ", std::strerror(errno));
    ::shm_unlink(name);
    return nullptr;
  }
  // ftruncate zero-fills: every slot starts at seq 0, no waiters.
  auto* h = static_cast<Header*>(base);
  h->nonce = nonce;
  h->size = size;
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  return std::unique_ptr<ShmAgreement>(new ShmAgreement(name, nonce, 0, size, base, bytes));
}

std::unique_ptr<ShmAgreement> ShmAgreement::open(const std::string& name, uint64_t nonce, int rank, int size,
                                                 std::string* why) {
  const size_t bytes = segment_bytes(size);
  int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    *why = str_cat("shm_open(", name, "): ", std::strerror(errno));
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes || st.st_uid != ::geteuid()) {
    *why = str_cat(name, " is not this group's segment (size or owner)");
    ::close(fd);
    return nullptr;
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    *why = str_cat("mmap(", name, "): ", std::strerror(errno));
    return nullptr;
  }
  auto* h = static_cast<Header*>(base);
  if (h->magic != kMagic || h->nonce != nonce || h->size != size) {
    *why = str_cat(name, " is not this group's segment (its nonce differs)");
    ::munmap(base, bytes);
    return nullptr;
  }
  return std::unique_ptr<ShmAgreement>(new ShmAgreement(name, nonce, rank, size, base, bytes));
}

ShmAgreement::Slot& ShmAgreement::slot(int r) const {
  return *reinterpret_cast<Slot*>(static_cast<char*>(base_) + kHeader + kSlotBytes * static_cast<size_t>(r));
}

void ShmAgreement::publish(uint64_t s, const int64_t* signature) {
  Slot& me = slot(rank_);
  std::memcpy(me.signature[s % 2], signature, sizeof(me.signature[0]));
  me.seq.store(s);  // seq_cst: ordered against the waiters' count below (see wait_for)
  me.futex.fetch_add(1);
  if (me.waiters.load() > 0) futex(&me.futex, FUTEX_WAKE, INT_MAX, nullptr);
}

bool ShmAgreement::wait_for(int r, uint64_t s, Clock::time_point until, const std::atomic<bool>* stop) {
  Slot& peer = slot(r);
  if (peer.seq.load() >= s) return true;
  const auto spin_end = std::min(until, Clock::now() + kSpin);
  while (Clock::now() < spin_end) {
    for (int i = 0; i < 64; ++i) cpu_relax();
    if (peer.seq.load() >= s) return true;
  }
  for (;;) {
    const uint32_t seen = peer.futex.load();
    peer.waiters.fetch_add(1);
    // A publish after `seen` was read changes the futex word (the wait returns at once) or, if it read the
    // waiters' count before our increment, stored seq before it: the load below then sees it.
    bool arrived = peer.seq.load() >= s;
    if (!arrived) {
      const auto now = Clock::now();
      if (now >= until || (stop && stop->load())) {
        peer.waiters.fetch_sub(1);
        return false;
      }
      const auto left = std::min<Clock::duration>(until - now, kSlice);
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      futex(&peer.futex, FUTEX_WAIT, seen, &ts);
      arrived = peer.seq.load() >= s;
    }
    peer.waiters.fetch_sub(1);
    if (arrived) return true;
    if (exited(r)) return false;  // (once a slice: a read of /proc)
  }
}

bool ShmAgreement::gather(uint64_t s, int64_t* all, Clock::time_point until, const std::atomic<bool>* stop) {
  for (int r = 0; r < size_; ++r) {
    if (!wait_for(r, s, until, stop)) return false;
    std::memcpy(all + static_cast<size_t>(r) * kSignatureFields, slot(r).signature[s % 2],
                sizeof(int64_t) * kSignatureFields);
  }
  return true;
}

std::vector<int> ShmAgreement::missing(uint64_t s) const {
  std::vector<int> out;
  for (int r = 0; r < size_; ++r) {
    if (slot(r).seq.load() < s) out.push_back(r);
  }
  return out;
}

}  // namespace dtrain::comm
