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
