#include "distributed/AgreementBoard.h"

#include "core/Config.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <fstream>
#include <new>
#include <random>
#include <sstream>
#include <thread>

namespace torchneuron::distributed {

// The segment: a header, then one area per rank, each on its own cache lines
// so that a rank's writes do not disturb the lines its peers poll.
struct AgreementBoard::Layout {
  struct alignas(64) Header {
    uint64_t nonce;  // rank 0's random number: proves the segment is this group's
    int32_t size;
  };
  struct alignas(64) Slot {
    std::atomic<uint64_t> seq;  // the check these values belong to (0: none yet)
    uint32_t count;
    int64_t values[kMaxValues];
  };
  struct alignas(64) Area {
    Slot slots[2];
    std::atomic<int64_t> pid;
  };
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "the board needs lock-free atomics");

  static size_t bytes(int size) { return sizeof(Header) + sizeof(Area) * static_cast<size_t>(size); }
  static Header* header(void* base) { return static_cast<Header*>(base); }
  static Area* area(void* base, int rank) {
    return reinterpret_cast<Area*>(static_cast<char*>(base) + sizeof(Header)) + rank;
  }
};

namespace {

std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }
std::string stringOf(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

void* mapSegment(int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Rank 0: a new segment, named after this process and a random number.
void* createSegment(size_t bytes, std::string& name, uint64_t& nonce) {
  std::random_device rd;
  nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  std::ostringstream n;
  n << "/torchneuron-agreement-" << getpid() << "-" << std::hex << nonce;
  name = n.str();
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return nullptr;
  void* base = ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? mapSegment(fd, bytes) : nullptr;
  close(fd);
  if (base == nullptr) shm_unlink(name.c_str());
  return base;
}

// Other ranks: rank 0's segment, if this machine has it and it is the right one.
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

// False once `pid` has exited (gone, or a zombie its parent has not reaped).
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

}  // namespace

std::unique_ptr<AgreementBoard> AgreementBoard::open(c10d::Store& store, int rank, int size) {
  // (The group's store: torch prefixes it per group, splits included.)
  const std::string key = "torchneuron/agreement/";
  const size_t bytes = Layout::bytes(size);
  const bool wanted = backendConfig().dist_shm;
  void* base = nullptr;
  std::string name;
  if (rank == 0) {
    uint64_t nonce = 0;
    if (wanted) base = createSegment(bytes, name, nonce);
    if (base != nullptr) {
      Layout::header(base)->nonce = nonce;
      Layout::header(base)->size = size;
    }
    store.set(key + "segment", bytesOf(base ? name + " " + std::to_string(nonce) : ""));
  } else {
    std::istringstream published(stringOf(store.get(key + "segment")));
    uint64_t nonce = 0;
    if (published >> name >> nonce && wanted) base = openSegment(name, bytes);
    if (base != nullptr &&
        (Layout::header(base)->nonce != nonce || Layout::header(base)->size != size)) {
      munmap(base, bytes);  // a segment of that name, but not this group's
      base = nullptr;
    }
  }
  if (base != nullptr) Layout::area(base, rank)->pid.store(getpid());
  const bool mapped = allRanksSay(store, key + "mapped/", rank, size, base != nullptr);
  if (rank == 0 && base != nullptr) shm_unlink(name.c_str());  // every rank has tried to open it
  // A rank must be able to tell whether its peers' processes live (another
  // PID namespace could not): only then can a dead peer be reported at once.
  bool seesPeers = mapped;
  for (int r = 0; seesPeers && r < size; ++r) {
    seesPeers = processAlive(Layout::area(base, r)->pid.load());
  }
  const bool use = allRanksSay(store, key + "usable/", rank, size, seesPeers);
  if (!use) {
    if (base != nullptr) munmap(base, bytes);
    return nullptr;
  }
  return std::unique_ptr<AgreementBoard>(new AgreementBoard(base, bytes, rank, size));
}

AgreementBoard::AgreementBoard(void* base, size_t bytes, int rank, int size)
    : base_(base), bytes_(bytes), rank_(rank), size_(size) {}

AgreementBoard::~AgreementBoard() { munmap(base_, bytes_); }

void AgreementBoard::waitFor(int peer, uint64_t seq, const char* op,
                             std::chrono::milliseconds timeout) {
  const auto& arrived = Layout::area(base_, peer)->slots[seq & 1].seq;
  // Ranks usually arrive within microseconds of each other: spin briefly,
  // then yield the core (the peer may need it), then sleep in short steps.
  for (int i = 0; i < 1000; ++i) {
    if (arrived.load(std::memory_order_acquire) >= seq) return;
  }
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto nextLivenessCheck = start + std::chrono::milliseconds(50);
  while (arrived.load(std::memory_order_acquire) < seq) {
    const auto now = Clock::now();
    TORCH_CHECK(now - start < timeout, op, ": rank ", peer,
                " of the group did not reach this collective within the group's timeout (",
                timeout.count(), " ms). Every rank must call the same collectives in the same "
                "order; a rank that stopped or hangs holds the others here.");
    if (now >= nextLivenessCheck) {
      const int64_t pid = Layout::area(base_, peer)->pid.load();
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

void AgreementBoard::exchange(const char* op, const std::vector<int64_t>& mine,
                              std::vector<int64_t>& hi, std::vector<int64_t>& lo,
                              std::chrono::milliseconds timeout) {
  const size_t n = mine.size();
  TORCH_CHECK(n <= kMaxValues, "AgreementBoard: a signature of ", n, " values (at most ",
              kMaxValues, ")");
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t seq = ++seq_;
  auto& slot = Layout::area(base_, rank_)->slots[seq & 1];
  slot.count = static_cast<uint32_t>(n);
  std::copy(mine.begin(), mine.end(), slot.values);
  slot.seq.store(seq, std::memory_order_release);
  hi = mine;
  lo = mine;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    waitFor(peer, seq, op, timeout);
    const auto& theirs = Layout::area(base_, peer)->slots[seq & 1];
    // Different operations may carry different counts; the operation (the
    // first value) then differs anyway.
    const size_t common = std::min<size_t>(n, theirs.count);
    for (size_t i = 0; i < common; ++i) {
      hi[i] = std::max(hi[i], theirs.values[i]);
      lo[i] = std::min(lo[i], theirs.values[i]);
    }
  }
}

}  // namespace torchneuron::distributed
