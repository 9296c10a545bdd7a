/* runtime_demo.c — a tour of the software NeuronCore runtime's C API:
 * devices, memory, streams, events, kernels, cross-device work and errors.
 * Until the PyTorch backend lands this is what `make demo` runs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "neuron/runtime.h"

#define CHECK(call)                                                                   \
  do {                                                                                \
    nrtStatus st_ = (call);                                                           \
    if (st_ != NRT_SUCCESS) {                                                         \
      fprintf(stderr, "%s:%d: %s\n  %s\n", __FILE__, __LINE__, #call,                 \
              nrtGetLastErrorMessage());                                              \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

/* y[i] = a * x[i] + y[i] over [begin, end) — a device kernel. */
typedef struct {
  float a;
  const float* x;
  float* y;
  size_t begin, end;
} SaxpyArgs;

static nrtStatus saxpy(void* p) {
  SaxpyArgs* k = (SaxpyArgs*)p;
  for (size_t i = k->begin; i < k->end; ++i) k->y[i] = k->a * k->x[i] + k->y[i];
  return NRT_SUCCESS;
}

/* out[0] = sum of in[0..n) in double — a device kernel on another device. */
typedef struct {
  const float* in;
  double* out;
  size_t n;
} SumArgs;

static nrtStatus sum(void* p) {
  SumArgs* k = (SumArgs*)p;
  double s = 0;
  for (size_t i = 0; i < k->n; ++i) s += k->in[i];
  *k->out = s;
  return NRT_SUCCESS;
}

typedef struct {
  size_t index, size;
} BoundsArgs;

static nrtStatus boundsChecked(void* p) {
  BoundsArgs* k = (BoundsArgs*)p;
  if (k->index >= k->size) {
    char msg[128];
    snprintf(msg, sizeof msg, "index %zu is out of bounds for size %zu", k->index, k->size);
    nrtKernelSetError(msg);
    return NRT_ERROR_INVALID_VALUE;
  }
  return NRT_SUCCESS;
}

int main(void) {
  int count = 0;
  CHECK(nrtGetDeviceCount(&count));
  printf("software NeuronCore runtime: %d device(s)\n", count);
  for (int d = 0; d < count; ++d) {
    nrtDeviceProperties p;
    CHECK(nrtGetDeviceProperties(&p, d));
    printf("  neuron:%d  %s  memory %.1f GiB  executor threads %d  priorities [%d, %d]\n", d,
           p.name, p.totalMemory / 1073741824.0, p.executorThreads, p.streamPriorityGreatest,
           p.streamPriorityLeast);
  }
  if (count < 2) {
    printf("the demo needs two devices (NEURON_RT_NUM_CORES >= 2)\n");
    return 1;
  }

  /* 1. Two streams on device 0 each run half of a saxpy. */
  const size_t n = 1 << 22;
  float* hx = malloc(n * sizeof(float));
  float* hy = malloc(n * sizeof(float));
  double expect = 0;
  for (size_t i = 0; i < n; ++i) {
    hx[i] = (float)(i % 1000) * 0.001f;
    hy[i] = 1.0f;
    expect += 2.0f * hx[i] + 1.0f;
  }
  float *x, *y, *y1;
  double* result;
  CHECK(nrtMalloc((void**)&x, n * sizeof(float), 0));
  CHECK(nrtMalloc((void**)&y, n * sizeof(float), 0));
  CHECK(nrtMalloc((void**)&y1, n * sizeof(float), 1));
  CHECK(nrtMalloc((void**)&result, sizeof(double), 1));

  nrtStream_t s0, s1, peer;
  CHECK(nrtStreamCreate(&s0, 0, 0));
  CHECK(nrtStreamCreate(&s1, 0, -1));
  CHECK(nrtStreamCreate(&peer, 1, 0));
  nrtEvent_t start, half0, half1, done;
  CHECK(nrtEventCreate(&start, NRT_EVENT_DEFAULT));
  CHECK(nrtEventCreate(&half0, NRT_EVENT_DISABLE_TIMING));
  CHECK(nrtEventCreate(&half1, NRT_EVENT_DISABLE_TIMING));
  CHECK(nrtEventCreate(&done, NRT_EVENT_DEFAULT));

  CHECK(nrtEventRecord(start, s0));
  CHECK(nrtMemcpyAsync(x, hx, n * sizeof(float), nrtMemcpyHostToDevice, s0));
  CHECK(nrtMemcpyAsync(y, hy, n * sizeof(float), nrtMemcpyHostToDevice, s0));
  CHECK(nrtEventRecord(half0, s0));
  CHECK(nrtStreamWaitEvent(s1, half0)); /* s1 starts after the uploads */
  SaxpyArgs a = {2.0f, x, y, 0, n / 2};
  SaxpyArgs b = {2.0f, x, y, n / 2, n};
  CHECK(nrtLaunchKernel(s0, "demo::saxpy[lo]", saxpy, &a, sizeof a));
  CHECK(nrtLaunchKernel(s1, "demo::saxpy[hi]", saxpy, &b, sizeof b));
  CHECK(nrtEventRecord(half0, s0));
  CHECK(nrtEventRecord(half1, s1));

  /* 2. Device 1 waits for both halves, copies the result over and sums it. */
  CHECK(nrtStreamWaitEvent(peer, half0));
  CHECK(nrtStreamWaitEvent(peer, half1));
  CHECK(nrtMemcpyAsync(y1, y, n * sizeof(float), nrtMemcpyDeviceToDevice, peer));
  SumArgs s = {y1, result, n};
  CHECK(nrtLaunchKernel(peer, "demo::sum", sum, &s, sizeof s));
  CHECK(nrtEventRecord(done, peer));
  printf("queued 2 uploads, 2 saxpy halves on two streams, a peer copy and a sum\n");

  double got = 0;
  CHECK(nrtMemcpyAsync(&got, result, sizeof got, nrtMemcpyDeviceToHost, peer));
  CHECK(nrtStreamSynchronize(peer));
  float ms = 0;
  CHECK(nrtEventElapsedTime(&ms, start, done));
  printf("sum of 2x+y over %zu elements: %.3f (host: %.3f) %s, %.2f ms on device\n", n, got,
         expect, fabs(got - expect) < 1e-6 * fabs(expect) ? "MATCH" : "MISMATCH", ms);

  /* 3. A failing kernel is reported at the next synchronizing call, with its
   *    name, and the stream keeps working. */
  BoundsArgs bad = {7, 3};
  CHECK(nrtLaunchKernel(s0, "demo::gather (runtime_demo.c)", boundsChecked, &bad, sizeof bad));
  nrtStatus st = nrtStreamSynchronize(s0);
  printf("failing kernel -> %s\n  %s\n", nrtGetErrorName(st), nrtGetLastErrorMessage());
  CHECK(nrtStreamSynchronize(s0));

  /* 4. The arena has a hard capacity. */
  nrtDeviceProperties p;
  CHECK(nrtGetDeviceProperties(&p, 0));
  void* huge = NULL;
  st = nrtMalloc(&huge, p.totalMemory, 0);
  printf("allocating the whole arena while 32 MiB are in use -> %s\n  %s\n", nrtGetErrorName(st),
         nrtGetLastErrorMessage());

  CHECK(nrtFree(x));
  CHECK(nrtFree(y));
  CHECK(nrtFree(y1));
  CHECK(nrtFree(result));
  CHECK(nrtStreamDestroy(s0));
  CHECK(nrtStreamDestroy(s1));
  CHECK(nrtStreamDestroy(peer));
  CHECK(nrtEventDestroy(start));
  CHECK(nrtEventDestroy(half0));
  CHECK(nrtEventDestroy(half1));
  CHECK(nrtEventDestroy(done));
  free(hx);
  free(hy);
  return fabs(got - expect) < 1e-6 * fabs(expect) ? 0 : 1;
}
