// ForkTest.cpp — a child forked after the runtime started has a stale copy
// of device memory and none of the executor threads: every device call in
// it fails with NRT_ERROR_FORKED (never waits forever or reads stale data),
// while the configuration queries keep working.
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "TestUtil.h"

namespace {

// Runs body in a forked child; returns its exit code (or 100 + signal).
template <class Body>
int inChild(Body body) {
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

bool forked(nrtStatus st) {
  return st == NRT_ERROR_FORKED &&
         std::string(nrtGetLastErrorMessage()).find("spawn") != std::string::npos;
}

}  // namespace

TEST(Fork, ChildOfStartedRuntimeIsRefused) {
  void* d = nullptr;
  NRT_OK(nrtMalloc(&d, 4096, 0));
  NRT_OK(nrtMemset(d, 7, 4096));
  // Work still queued when the parent forks (the child would wait for it forever).
  SleepArgs sleep{200000};
  NRT_OK(nrtLaunchKernel(defaultStream(), "sleepKernel", sleepKernel, &sleep, sizeof sleep));
  nrtStream_t stream = defaultStream();
  int code = inChild([&] {
    char host[16];
    void* p = nullptr;
    nrtEvent_t ev;
    int count = 0;
    nrtDeviceProperties props;
    if (!forked(nrtMemcpy(host, d, sizeof host, nrtMemcpyDeviceToHost))) return 1;
    if (!forked(nrtStreamSynchronize(stream))) return 2;
    if (!forked(nrtDeviceSynchronize(0))) return 3;
    if (!forked(nrtMalloc(&p, 16, 0))) return 4;
    if (!forked(nrtFree(d))) return 5;
    if (!forked(nrtEventCreate(&ev, 0))) return 6;
    if (!forked(nrtLaunchKernel(stream, "k", sleepKernel, &sleep, sizeof sleep))) return 7;
    // Configuration queries need no thread and still answer.
    if (nrtGetDeviceCount(&count) != NRT_SUCCESS || count != 2) return 8;
    if (nrtGetDeviceProperties(&props, 0) != NRT_SUCCESS) return 9;
    return 0;
  });
  EXPECT_EQ(code, 0);
  NRT_OK(nrtStreamSynchronize(defaultStream()));  // the parent is unaffected
  unsigned char back = 0;
  NRT_OK(nrtMemcpy(&back, d, 1, nrtMemcpyDeviceToHost));
  EXPECT_EQ(back, 7);
  NRT_OK(nrtFree(d));
}
