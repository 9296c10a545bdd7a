// ConfigTest.cpp — parsing of the NEURON_RT_* variables, and the
// configuration this process was started with (see CMakeLists.txt).
#include <cstdlib>
#include <string>

#include "Config.h"
#include "TestUtil.h"

using nrt::parseBytes;
using nrt::parseCoreList;

TEST(Config, ParsesCoreLists) {
  std::vector<int> cores;
  std::string why;
  ASSERT_TRUE(parseCoreList("0,2-3", 4, &cores, &why)) << why;
  EXPECT_EQ(cores, (std::vector<int>{0, 2, 3}));
  ASSERT_TRUE(parseCoreList("1", 2, &cores, &why));
  EXPECT_EQ(cores, (std::vector<int>{1}));
}

TEST(Config, RejectsBadCoreLists) {
  std::vector<int> cores;
  std::string why;
  EXPECT_FALSE(parseCoreList("2", 2, &cores, &why));
  EXPECT_NE(why.find("does not exist"), std::string::npos) << why;
  EXPECT_FALSE(parseCoreList("0,0", 2, &cores, &why));
  EXPECT_NE(why.find("twice"), std::string::npos) << why;
  EXPECT_FALSE(parseCoreList("a", 2, &cores, &why));
  EXPECT_FALSE(parseCoreList("1-0", 2, &cores, &why));
  EXPECT_FALSE(parseCoreList("", 2, &cores, &why));
}

TEST(Config, ParsesSizes) {
  size_t n = 0;
  ASSERT_TRUE(parseBytes("512", &n));
  EXPECT_EQ(n, 512u);
  ASSERT_TRUE(parseBytes("64K", &n));
  EXPECT_EQ(n, 64u << 10);
  ASSERT_TRUE(parseBytes("3G", &n));
  EXPECT_EQ(n, size_t(3) << 30);
  EXPECT_FALSE(parseBytes("", &n));
  EXPECT_FALSE(parseBytes("-1", &n));
  EXPECT_FALSE(parseBytes("12X", &n));
  EXPECT_FALSE(parseBytes("99999999999999T", &n));
}

// Checks what this process was configured with; the EXPECT_* variables are
// set by the ctest entries that run this binary under other settings.
TEST(EnvConfig, MatchesEnvironment) {
  const char* invalid = std::getenv("EXPECT_INVALID");
  int count = -1;
  if (invalid) {
    EXPECT_EQ(nrtGetDeviceCount(&count), NRT_ERROR_INVALID_CONFIG);
    EXPECT_NE(std::string(nrtGetLastErrorMessage()).find(invalid), std::string::npos)
        << nrtGetLastErrorMessage();
    void* p = nullptr;
    EXPECT_EQ(nrtMalloc(&p, 16, 0), NRT_ERROR_INVALID_CONFIG);
    return;
  }
  NRT_OK(nrtGetDeviceCount(&count));
  const char* devices = std::getenv("EXPECT_DEVICES");
  EXPECT_EQ(count, devices ? std::atoi(devices) : 2);
  nrtDeviceProperties props;
  NRT_OK(nrtGetDeviceProperties(&props, 0));
  if (const char* core0 = std::getenv("EXPECT_CORE0")) {
    EXPECT_EQ(props.physicalCore, std::atoi(core0));
  }
  if (const char* mem = std::getenv("EXPECT_MEMORY")) {
    EXPECT_EQ(props.totalMemory, std::strtoull(mem, nullptr, 10));
  }
  EXPECT_EQ(launchBlocking(), std::getenv("EXPECT_BLOCKING") != nullptr);
}

namespace {
// Sets one variable for the duration of a scope (readConfig reads the
// environment on every call; the runtime itself reads it once).
struct ScopedEnv {
  std::string name;
  std::string old;
  bool had;
  ScopedEnv(const char* n, const char* value) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    setenv(n, value, 1);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

void expectInvalid(const char* var, const char* value, const char* range) {
  ScopedEnv e(var, value);
  nrt::Config c = nrt::readConfig();
  EXPECT_EQ(c.status, NRT_ERROR_INVALID_CONFIG) << var << "=" << value;
  EXPECT_NE(c.error.find(std::string(var) + "=" + value), std::string::npos) << c.error;
  EXPECT_NE(c.error.find(range), std::string::npos) << c.error;
  EXPECT_TRUE(c.visibleCores.empty());
}

void expectValid(const char* var, const char* value) {
  ScopedEnv e(var, value);
  nrt::Config c = nrt::readConfig();
  EXPECT_EQ(c.status, NRT_SUCCESS) << var << "=" << value << ": " << c.error;
}
}  // namespace

// Values out of range are configuration errors naming the variable and the
// range, never a wrapped device count or an arena no allocation fits in.
TEST(Config, OutOfRangeValuesAreErrors) {
  for (const char* v : {"65", "128", "300", "1024", "-1", "99999999999999999999"})
    expectInvalid("NEURON_RT_NUM_CORES", v, "from 0 to 64");
  expectValid("NEURON_RT_NUM_CORES", "64");
  expectValid("NEURON_RT_NUM_CORES", "0");
  for (const char* v : {"1M", "63M", "0", "1", "2T", "16T"})
    expectInvalid("NEURON_RT_MEMORY_PER_CORE", v, "from 64M to 1T");
  expectValid("NEURON_RT_MEMORY_PER_CORE", "64M");
  expectValid("NEURON_RT_MEMORY_PER_CORE", "1T");
  for (const char* v : {"0", "65", "-2"})
    expectInvalid("NEURON_RT_EXECUTOR_THREADS", v, "from 1 to 64");
  for (const char* v : {"0", "1025"})
    expectInvalid("NEURON_RT_COMPUTE_THREADS", v, "from 1 to 1024");
  for (const char* v : {"0", "63", "16777217", "8K"})
    expectInvalid("NEURON_RT_QUEUE_DEPTH", v, "from 64 to 16777216");
  expectValid("NEURON_RT_QUEUE_DEPTH", "64");
  {
    ScopedEnv e("NEURON_RT_NUM_CORES", "64");
    nrt::Config c = nrt::readConfig();
    EXPECT_EQ(c.visibleCores.size(), 64u);
  }
}

// One core per local process under torchrun (LOCAL_WORLD_SIZE), at least
// the default two; NEURON_RT_NUM_CORES still decides when set.
TEST(Config, LocalWorldSizeSetsTheCoreCount) {
  {
    ScopedEnv e("LOCAL_WORLD_SIZE", "4");
    EXPECT_EQ(nrt::readConfig().numCores, 4);
  }
  {
    ScopedEnv e("LOCAL_WORLD_SIZE", "1");
    EXPECT_EQ(nrt::readConfig().numCores, 2);
  }
  {
    ScopedEnv e("LOCAL_WORLD_SIZE", "junk");
    nrt::Config c = nrt::readConfig();
    EXPECT_EQ(c.status, NRT_SUCCESS);
    EXPECT_EQ(c.numCores, 2);
  }
  {
    ScopedEnv a("LOCAL_WORLD_SIZE", "4");
    ScopedEnv b("NEURON_RT_NUM_CORES", "3");
    EXPECT_EQ(nrt::readConfig().numCores, 3);
  }
}

// Under a launcher each process starts on core LOCAL_RANK (modulo the
// visible devices); elsewhere on 0; a value it cannot read is ignored.
TEST(Config, LocalRankIsTheInitialDevice) {
  EXPECT_EQ(nrt::readConfig().initialDevice, 0);
  {
    ScopedEnv a("LOCAL_WORLD_SIZE", "4");
    ScopedEnv b("LOCAL_RANK", "3");
    EXPECT_EQ(nrt::readConfig().initialDevice, 3);
  }
  {
    ScopedEnv a("LOCAL_RANK", "3");
    EXPECT_EQ(nrt::readConfig().initialDevice, 1);  // two cores by default
  }
  {
    ScopedEnv a("LOCAL_RANK", "1");
    ScopedEnv b("NEURON_RT_VISIBLE_CORES", "1");
    EXPECT_EQ(nrt::readConfig().initialDevice, 0);  // one visible device
  }
  {
    ScopedEnv a("LOCAL_RANK", "junk");
    nrt::Config c = nrt::readConfig();
    EXPECT_EQ(c.status, NRT_SUCCESS);
    EXPECT_EQ(c.initialDevice, 0);
  }
}
