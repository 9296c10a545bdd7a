/* torchneuron_kernel.h — the custom-kernel ABI of torchneuron's software NeuronCore.
 *
 * A kernel is a C function
 *
 *     extern "C" void my_kernel(const tn_args* args);
 *
 * compiled for the host (torchneuron.kernels.cpp_kernel builds it from source,
 * torchneuron.kernels.load_kernel loads it from a prebuilt library). Calling
 * the Kernel object from Python with tensors and numbers queues it as one work
 * item on the current stream of the tensors' neuron device (kind "custom",
 * named as the kernel), so the host returns at once and the kernel runs in
 * stream order with every other op; called with CPU tensors it runs at once on
 * the calling thread (a reference for tests).
 *
 * The kernel receives, in call order, the tensors (data pointer, sizes and
 * strides in elements, dtype) and the numbers (each as a double and an
 * int64). It may read and write the tensors' memory and nothing else; it must
 * not throw or call back into Python. Work is split over the device's compute
 * threads with args->parallel_for (or tn_parallel in C++).
 *
 * This header is prepended to a cpp_kernel's source; prebuilt libraries
 * include it (torchneuron.kernels.include_dir()).
 */
#ifndef TORCHNEURON_KERNEL_H
#define TORCHNEURON_KERNEL_H

#include <stdint.h>
#include <string.h>

#define TN_ABI_VERSION 1
#define TN_MAX_DIMS 8
#define TN_MAX_TENSORS 16
#define TN_MAX_SCALARS 16

enum tn_dtype {
  TN_FLOAT32 = 0, TN_FLOAT64 = 1, TN_FLOAT16 = 2, TN_BFLOAT16 = 3,
  TN_INT64 = 4, TN_INT32 = 5, TN_INT16 = 6, TN_INT8 = 7, TN_UINT8 = 8, TN_BOOL = 9
};

typedef struct tn_tensor {
  void* data;                    /* first element (storage offset applied) */
  int64_t numel;
  int32_t ndim;
  int32_t dtype;                 /* enum tn_dtype */
  int64_t sizes[TN_MAX_DIMS];
  int64_t strides[TN_MAX_DIMS];  /* in elements */
} tn_tensor;

typedef struct tn_scalar {
  double f;                      /* the number as a double ... */
  int64_t i;                     /* ... and as an integer (floats truncated) */
} tn_scalar;

typedef void (*tn_body)(int64_t begin, int64_t end, void* ctx);

typedef struct tn_args {
  int32_t abi_version;           /* TN_ABI_VERSION */
  int32_t device;                /* neuron device index, -1 on CPU */
  int32_t num_tensors;
  int32_t num_scalars;
  /* Runs body over chunks of [begin, end), each at least `grain` long, on the
     device's compute threads, and returns when every chunk has run. */
  void (*parallel_for)(int64_t begin, int64_t end, int64_t grain, tn_body body, void* ctx);
  tn_tensor tensors[TN_MAX_TENSORS];
  tn_scalar scalars[TN_MAX_SCALARS];
} tn_args;

/* bfloat16 <-> float, as PyTorch converts (round to nearest even, NaN kept). */
static inline float tn_bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}
static inline uint16_t tn_float_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

#ifdef __cplusplus
/* C++: element i of a float32 or bfloat16 buffer as float, and back (kernels
   written once for both dtypes, as templates over float / uint16_t). */
inline float tn_load(const float* p, int64_t i) { return p[i]; }
inline float tn_load(const uint16_t* p, int64_t i) { return tn_bf16_to_float(p[i]); }
inline void tn_store(float* p, int64_t i, float v) { p[i] = v; }
inline void tn_store(uint16_t* p, int64_t i, float v) { p[i] = tn_float_to_bf16(v); }

/* C++: tn_parallel(args, 0, rows, 16, [&](int64_t lo, int64_t hi) { ... }); */
template <class F>
inline void tn_parallel(const tn_args* args, int64_t begin, int64_t end, int64_t grain, F&& f) {
  args->parallel_for(
      begin, end, grain,
      [](int64_t lo, int64_t hi, void* ctx) { (*static_cast<F*>(ctx))(lo, hi); },
      static_cast<void*>(&f));
}
#endif

#endif /* TORCHNEURON_KERNEL_H */
