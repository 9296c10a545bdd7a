#include "distributed/SharedSegment.h"

#include "core/Config.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

namespace torchneuron::distributed {
namespace {

constexpr size_t kPage = 4096;

// The segment's first page(s): whose it is, then every rank's process ID.
struct alignas(64) Header {
  uint64_t nonce;  // rank 0's random number: proves the segment is this group's
  int32_t size;
};
static_assert(std::atomic<int64_t>::is_always_lock_free, "shared segments need lock-free atomics");

size_t headerBytes(int size) {
  const size_t raw = sizeof(Header) + sizeof(std::atomic<int64_t>) * static_cast<size_t>(size);
  return (raw + kPage - 1) / kPage * kPage;
}

Header* header(void* base) { return static_cast<Header*>(base); }
std::atomic<int64_t>& pidSlot(void* base, int rank) {
  return reinterpret_cast<std::atomic<int64_t>*>(static_cast<char*>(base) + sizeof(Header))[rank];
}

std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }
std::string stringOf(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

void* mapSegment(int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Rank 0: a new segment with its pages reserved (tmpfs allocates on touch;
// a touch that finds /dev/shm full is a SIGBUS, so reserve now or not at all).
void* createSegment(const std::string& purpose, size_t bytes, std::string& name, uint64_t& nonce) {
  std::random_device rd;
  nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  std::ostringstream n;
  n << "/torchneuron-" << purpose << "-" << getpid() << "-" << std::hex << nonce;
  name = n.str();
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return nullptr;
  void* base = nullptr;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0 &&
      posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0) {
    base = mapSegment(fd, bytes);
  }
  close(fd);
  if (base == nullptr) shm_unlink(name.c_str());
  return base;
}

// Other ranks: rank 0's segment, if this machine has it and it is the right size.
void* openSegment(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* base = (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes)
                   ? mapSegment(fd, bytes)
                   : nullptr;
  close(fd);
  return base;
}

// Whether every rank set `key/<rank>` to "1" (each rank sets its own first).
bool allRanksSay(c10d::Store& store, const std::string& key, int rank, int size, bool mine) {
  store.set(key + std::to_string(rank), bytesOf(mine ? "1" : "0"));
  bool all = true;
  for (int r = 0; r < size; ++r) all = stringOf(store.get(key + std::to_string(r))) == "1" && all;
  return all;
}

}  // namespace

bool processAlive(int64_t pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: kill() is all we know
  const auto paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

std::unique_ptr<SharedSegment> SharedSegment::open(c10d::Store& store, const std::string& purpose,
                                                   int rank, int size, size_t bytes) {
  // (The group's store: torch prefixes it per group, splits included.)
  const std::string key = "torchneuron/" + purpose + "/";
  const size_t mapped = headerBytes(size) + (bytes + kPage - 1) / kPage * kPage;
  const bool wanted = backendConfig().dist_shm;
  void* base = nullptr;
  std::string name;
  if (rank == 0) {
    uint64_t nonce = 0;
    if (wanted) base = createSegment(purpose, mapped, name, nonce);
    if (base != nullptr) {
      header(base)->nonce = nonce;
      header(base)->size = size;
    }
    store.set(key + "segment", bytesOf(base ? name + " " + std::to_string(nonce) : ""));
  } else {
    std::istringstream published(stringOf(store.get(key + "segment")));
    uint64_t nonce = 0;
    if (published >> name >> nonce && wanted) base = openSegment(name, mapped);
    if (base != nullptr && (header(base)->nonce != nonce || header(base)->size != size)) {
      munmap(base, mapped);  // a segment of that name, but not this group's
      base = nullptr;
    }
  }
  if (base != nullptr) pidSlot(base, rank).store(getpid());
  const bool ok = allRanksSay(store, key + "mapped/", rank, size, base != nullptr);
  if (rank == 0 && base != nullptr) shm_unlink(name.c_str());  // every rank has tried to open it
  // A rank must be able to tell whether its peers' processes live (another
  // PID namespace could not): only then can a dead peer be reported at once.
  bool seesPeers = ok;
  for (int r = 0; seesPeers && r < size; ++r) seesPeers = processAlive(pidSlot(base, r).load());
  if (!allRanksSay(store, key + "usable/", rank, size, seesPeers)) {
    if (base != nullptr) munmap(base, mapped);
    return nullptr;
  }
  return std::unique_ptr<SharedSegment>(new SharedSegment(base, mapped, rank, size));
}

SharedSegment::SharedSegment(void* base, size_t mapped, int rank, int size)
    : base_(base),
      mapped_(mapped),
      data_(static_cast<char*>(base) + headerBytes(size)),
      rank_(rank),
      size_(size) {}

SharedSegment::~SharedSegment() { munmap(base_, mapped_); }

int64_t SharedSegment::pidOf(int rank) const { return pidSlot(base_, rank).load(); }

void SharedSegment::waitFor(const std::atomic<uint64_t>& value, uint64_t target, int peer,
                            const char* op, std::chrono::milliseconds timeout) const {
  // Ranks usually arrive within microseconds of each other: spin briefly,
  // then yield the core (the peer may need it), then sleep in short steps.
  for (int i = 0; i < 1000; ++i) {
    if (value.load(std::memory_order_acquire) >= target) return;
  }
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto nextLivenessCheck = start + std::chrono::milliseconds(50);
  while (value.load(std::memory_order_acquire) < target) {
    const auto now = Clock::now();
    TORCH_CHECK(now - start < timeout, op, ": rank ", peer,
                " of the group did not reach this collective within the group's timeout (",
                timeout.count(), " ms). Every rank must call the same collectives in the same "
                "order; a rank that stopped or hangs holds the others here.");
    if (now >= nextLivenessCheck) {
      const int64_t pid = pidOf(peer);
      TORCH_CHECK(processAlive(pid), op, ": rank ", peer, " of the group (process ", pid,
                  ") has exited, so this collective cannot complete.");
      nextLivenessCheck = now + std::chrono::milliseconds(50);
    }
    if (now - start < std::chrono::milliseconds(1)) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace torchneuron::distributed
