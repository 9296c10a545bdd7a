/*
 * neuron/runtime.h — the NeuronCore runtime C API (the HAL).
 *
 * Everything above this header (the PyTorch backend in csrc/, the Python
 * package) talks to the chip only through these calls. The implementation in
 * runtime/src/ is a *software* NeuronCore that executes device work on host
 * CPU threads; a second chip is a second implementation of this header.
 *
 * Conventions
 * - Every call returns an nrtStatus. NRT_SUCCESS is 0. On failure the calling
 *   thread's last-error message (nrtGetLastErrorMessage) says what went wrong
 *   in words; on success that message is left unchanged.
 * - Any thread may call any function concurrently. Using a stream or event
 *   handle concurrently with its own destruction is a caller race; using it
 *   after destruction is detected and returns NRT_ERROR_INVALID_HANDLE.
 * - Devices are numbered 0..count-1 among the cores visible to this process.
 * - Device memory is host-addressable (the chip is the host), but only the
 *   runtime and kernels may touch it: callers move data with the copy calls.
 *
 * Configuration (read once, at the first call into the runtime):
 *   NEURON_RT_NUM_CORES        cores the software chip has, 0 to 64 (default 2)
 *   NEURON_RT_VISIBLE_CORES    which of them this process sees: "0,1", "1-3",
 *                              "2" (default: all)
 *   NEURON_RT_MEMORY_PER_CORE  arena capacity per core, bytes with optional
 *                              K/M/G/T suffix, 64M to 1T (default 8G)
 *   NEURON_RT_EXECUTOR_THREADS worker threads per core executing streams,
 *                              1 to 64 (default 2)
 *   NEURON_RT_QUEUE_DEPTH      work items a stream holds queued before a
 *                              launch on it waits for the stream to run
 *                              half of them, 64 to 16777216 (default 16384)
 *   NEURON_RT_COMPUTE_THREADS  threads a kernel may use for compute, reported
 *                              in the device properties, 1 to 1024 (default:
 *                              host cores)
 *   NEURON_LAUNCH_BLOCKING     "1": launches and async copies run
 *                              synchronously on the calling thread and return
 *                              the kernel's status at once (debugging aid)
 * A malformed or out-of-range value makes every call fail with
 * NRT_ERROR_INVALID_CONFIG and a message naming the variable and its range.
 *
 * Processes: the device count, properties and current device need only the
 * configuration; the first other call starts the devices (reserves arenas,
 * starts executor threads). In a child forked after that, every call but
 * those returns NRT_ERROR_FORKED: the child has neither the threads nor a
 * live copy of device memory (start children with spawn instead).
 *
 * Kernels: a kernel must not wait for work queued behind itself.
 * nrtStreamSynchronize / nrtStreamDestroy of its own stream,
 * nrtDeviceSynchronize of its own device (and so a synchronous copy or
 * memset on it) and nrtEventSynchronize of an event recorded after it on its
 * stream return NRT_ERROR_INVALID_VALUE from inside a kernel.
 */
#ifndef NEURON_RUNTIME_H_
#define NEURON_RUNTIME_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NRT_API __attribute__((visibility("default")))
#else
#define NRT_API
#endif

/* ------------------------------------------------------------------------ */
/* Status                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum nrtStatus {
  NRT_SUCCESS = 0,
  NRT_ERROR_INVALID_VALUE = 1,     /* a NULL out-pointer, bad size or flag   */
  NRT_ERROR_INVALID_DEVICE = 2,    /* device index out of range              */
  NRT_ERROR_OUT_OF_MEMORY = 3,     /* the device arena cannot fit the request */
  NRT_ERROR_INVALID_POINTER = 4,   /* not a live allocation of this runtime  */
  NRT_ERROR_INVALID_DIRECTION = 5, /* copy kind does not match the pointers  */
  NRT_ERROR_INVALID_HANDLE = 6,    /* stream/event destroyed or never made   */
  NRT_ERROR_NOT_READY = 7,         /* query: work still pending (not a fault) */
  NRT_ERROR_EVENT_NOT_RECORDED = 8,/* the event was never recorded           */
  NRT_ERROR_TIMING_DISABLED = 9,   /* elapsed time on a non-timing event     */
  NRT_ERROR_KERNEL_FAILED = 10,    /* a kernel on the stream reported failure */
  NRT_ERROR_INVALID_CONFIG = 11,   /* a malformed NEURON_RT_* variable       */
  NRT_ERROR_INTERNAL = 12,         /* the host refused a resource (threads)  */
  NRT_ERROR_FORKED = 13            /* a child forked after the runtime started */
} nrtStatus;

/* Short constant name of a status, e.g. "NRT_ERROR_OUT_OF_MEMORY". Never NULL. */
NRT_API const char* nrtGetErrorName(nrtStatus status);

/* One-line description of a status class. Never NULL. */
NRT_API const char* nrtGetErrorString(nrtStatus status);

/* The detailed message of the last failing call made on this thread: what
 * was expected, what was found (for a kernel failure: its name and its own
 * message; when one call reports several failures, all of them, oldest
 * first: the first eight in full, the rest by kernel name). Empty string
 * when no call on this thread has failed. The pointer
 * stays valid until the next runtime call on this thread. */
NRT_API const char* nrtGetLastErrorMessage(void);

/* ------------------------------------------------------------------------ */
/* Devices                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct nrtDeviceProperties {
  char name[64];          /* "NeuronCore-v2 (software)"                     */
  size_t totalMemory;     /* arena capacity in bytes                        */
  int computeThreads;     /* threads a kernel may use                       */
  int executorThreads;    /* threads executing this device's streams        */
  int physicalCore;       /* index among NEURON_RT_NUM_CORES                */
  int streamPriorityLeast;    /* lowest priority (numerically largest), 0   */
  int streamPriorityGreatest; /* highest priority (numerically smallest)    */
} nrtDeviceProperties;

/* Number of visible devices. Errors: INVALID_VALUE (count NULL),
 * INVALID_CONFIG. A count of 0 is possible (NEURON_RT_NUM_CORES=0). */
NRT_API nrtStatus nrtGetDeviceCount(int* count);

/* Fills *props for device. Errors: INVALID_VALUE, INVALID_DEVICE,
 * INVALID_CONFIG. */
NRT_API nrtStatus nrtGetDeviceProperties(nrtDeviceProperties* props, int device);

/* Sets / gets the calling thread's current device (initially 0). It is only
 * a thread-local convenience for layers above; every other call names its
 * device explicitly. Errors: INVALID_DEVICE, INVALID_VALUE (NULL). */
NRT_API nrtStatus nrtSetDevice(int device);
NRT_API nrtStatus nrtGetDevice(int* device);

/* Blocks until all work on every stream of device has finished. Reports
 * every unreported kernel failure of its streams (KERNEL_FAILED, each
 * failure reported once, all named in one message). Errors: INVALID_DEVICE. */
NRT_API nrtStatus nrtDeviceSynchronize(int device);

/* Free and total arena bytes of device. Errors: INVALID_VALUE,
 * INVALID_DEVICE. */
NRT_API nrtStatus nrtMemGetInfo(int device, size_t* freeBytes, size_t* totalBytes);

/* Size of the largest free range in device's arena, i.e. the largest single
 * nrtMalloc that can succeed now. Smaller than nrtMemGetInfo's free bytes
 * when the free memory is fragmented; out-of-memory reports use it to tell
 * fragmentation from exhaustion. Errors: INVALID_VALUE, INVALID_DEVICE. */
NRT_API nrtStatus nrtMemGetLargestFreeRange(int device, size_t* bytes);

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */
/* ------------------------------------------------------------------------ */

/* Alignment of every device allocation, in bytes. */
#define NRT_DEVICE_ALIGNMENT 256

/* Allocates size bytes in device's arena. size 0 returns *ptr = NULL and
 * success. The memory is not initialised. Errors: INVALID_VALUE (ptr NULL),
 * INVALID_DEVICE, OUT_OF_MEMORY (the arena has no free range that large;
 * never falls back to host memory). */
NRT_API nrtStatus nrtMalloc(void** ptr, size_t size, int device);

/* Frees a device allocation made by nrtMalloc. NULL is a no-op. The caller
 * must make sure no queued work still uses it. Errors: INVALID_POINTER (not
 * the base of a live device allocation: foreign, interior or already freed). */
NRT_API nrtStatus nrtFree(void* ptr);

/* Page-locked ("pinned") host memory, the fast source/target of async
 * copies. Errors: INVALID_VALUE, OUT_OF_MEMORY (the host refused, or a size
 * too large to round up to whole pages). */
NRT_API nrtStatus nrtHostAlloc(void** ptr, size_t size);

/* Frees nrtHostAlloc memory. NULL is a no-op. Errors: INVALID_POINTER. */
NRT_API nrtStatus nrtHostFree(void* ptr);

typedef enum nrtMemoryType {
  nrtMemoryTypeUnregistered = 0, /* not known to the runtime (pageable host) */
  nrtMemoryTypeHost = 1,         /* pinned host memory (nrtHostAlloc)        */
  nrtMemoryTypeDevice = 2        /* device memory (nrtMalloc)                */
} nrtMemoryType;

typedef struct nrtPointerAttributes {
  nrtMemoryType type;
  int device;  /* owning device for device memory, -1 otherwise            */
  void* base;  /* start of the enclosing allocation, NULL if unregistered  */
  size_t size; /* size of the enclosing allocation, 0 if unregistered      */
} nrtPointerAttributes;

/* Describes any pointer, interior pointers included, in O(log n) of live
 * allocations. Unknown pointers succeed with type Unregistered.
 * Errors: INVALID_VALUE (attr NULL). */
NRT_API nrtStatus nrtPointerGetAttributes(nrtPointerAttributes* attr, const void* ptr);

typedef enum nrtMemcpyKind {
  nrtMemcpyHostToDevice = 1,
  nrtMemcpyDeviceToHost = 2,
  nrtMemcpyDeviceToDevice = 3, /* same or different devices */
  nrtMemcpyDefault = 4,        /* inferred from the pointers */
  /* Not kinds: they give the enum the range of int, so any int a caller
   * passes is a value the runtime may test (and reject with INVALID_VALUE);
   * in C++ a value outside an enum's range is undefined behaviour. */
  nrtMemcpyKindRangeMin_ = -2147483647 - 1,
  nrtMemcpyKindRangeMax_ = 2147483647
} nrtMemcpyKind;

typedef uint64_t nrtStream_t; /* 0 is never a valid stream */
typedef uint64_t nrtEvent_t;  /* 0 is never a valid event  */

/* Copies count bytes and returns when the copy is done. Device ranges must
 * lie inside one live allocation. Ordering: like CUDA's legacy stream, a
 * synchronous copy first waits for all work queued on the involved devices.
 * A zero-byte copy touches no memory and is a no-op (NULL pointers allowed;
 * the kind, and for async copies the stream, are still checked).
 * Errors: INVALID_VALUE (NULL with count > 0, bad kind, a range that wraps
 * around the address space),
 * INVALID_DIRECTION (a pointer is not of the kind named: e.g. HostToDevice
 * with a device source or a host destination), INVALID_POINTER (a device
 * range runs past its allocation, a host range runs into device memory),
 * KERNEL_FAILED (a pending failure of the
 * involved devices, reported once). */
NRT_API nrtStatus nrtMemcpy(void* dst, const void* src, size_t count, nrtMemcpyKind kind);

/* As nrtMemcpy, queued on stream: returns at once and the copy runs in
 * stream order. Host memory must stay valid until the copy is done.
 * Errors: as nrtMemcpy, plus INVALID_HANDLE. */
NRT_API nrtStatus nrtMemcpyAsync(void* dst, const void* src, size_t count,
                                 nrtMemcpyKind kind, nrtStream_t stream);

/* Sets count bytes of device memory to (unsigned char)value. count 0 is a
 * no-op (the async form still checks its stream).
 * Errors: INVALID_VALUE, INVALID_POINTER (not inside one device allocation). */
NRT_API nrtStatus nrtMemset(void* ptr, int value, size_t count);
NRT_API nrtStatus nrtMemsetAsync(void* ptr, int value, size_t count, nrtStream_t stream);

/* ------------------------------------------------------------------------ */
/* Streams                                                                   */
/* ------------------------------------------------------------------------ */

/* Work queued on one stream runs in order; work on different streams may
 * overlap. Lower priority numbers mean higher priority (as in CUDA); any int
 * is accepted and clamped to [greatest, least] of the device properties. */

/* The device's default stream (never destroyed). Errors: INVALID_VALUE,
 * INVALID_DEVICE. */
NRT_API nrtStatus nrtStreamGetDefault(nrtStream_t* stream, int device);

/* Creates a stream on device. Errors: INVALID_VALUE, INVALID_DEVICE,
 * INTERNAL (handle space exhausted). */
NRT_API nrtStatus nrtStreamCreate(nrtStream_t* stream, int device, int priority);

/* Waits for the stream's queued work, then destroys it. Errors:
 * INVALID_HANDLE (unknown/destroyed, or the default stream). */
NRT_API nrtStatus nrtStreamDestroy(nrtStream_t stream);

/* Device and clamped priority of a stream. Errors: INVALID_HANDLE,
 * INVALID_VALUE. */
NRT_API nrtStatus nrtStreamGetDevice(nrtStream_t stream, int* device);
NRT_API nrtStatus nrtStreamGetPriority(nrtStream_t stream, int* priority);

/* SUCCESS when all queued work is done, NOT_READY otherwise. A kernel
 * failure on the stream is returned once (KERNEL_FAILED) when the stream
 * is done. Errors: INVALID_HANDLE. */
NRT_API nrtStatus nrtStreamQuery(nrtStream_t stream);

/* Blocks until all queued work is done; reports the stream's unreported
 * kernel failures (each once, all named in one message).
 * Errors: INVALID_HANDLE, KERNEL_FAILED. */
NRT_API nrtStatus nrtStreamSynchronize(nrtStream_t stream);

/* Work queued on stream after this call waits until the event's most recent
 * record has completed (any device). Returns at once on the host.
 * Errors: INVALID_HANDLE (stream or event), EVENT_NOT_RECORDED. */
NRT_API nrtStatus nrtStreamWaitEvent(nrtStream_t stream, nrtEvent_t event);

/* ------------------------------------------------------------------------ */
/* Events                                                                    */
/* ------------------------------------------------------------------------ */

#define NRT_EVENT_DEFAULT 0x0
#define NRT_EVENT_DISABLE_TIMING 0x2

/* Creates an event; flags are NRT_EVENT_DEFAULT (timing on) or
 * NRT_EVENT_DISABLE_TIMING. Errors: INVALID_VALUE (NULL, unknown flag). */
NRT_API nrtStatus nrtEventCreate(nrtEvent_t* event, unsigned flags);

/* Destroys an event; pending records still complete harmlessly.
 * Errors: INVALID_HANDLE. */
NRT_API nrtStatus nrtEventDestroy(nrtEvent_t event);

/* Captures the work queued on stream so far; the event completes when that
 * work has run. Re-recording replaces the capture. Errors: INVALID_HANDLE. */
NRT_API nrtStatus nrtEventRecord(nrtEvent_t event, nrtStream_t stream);

/* SUCCESS when the latest record has completed, NOT_READY if not yet.
 * Errors: INVALID_HANDLE, EVENT_NOT_RECORDED, KERNEL_FAILED (a failure
 * queued before the record on its stream, reported once). */
NRT_API nrtStatus nrtEventQuery(nrtEvent_t event);

/* Blocks until the latest record has completed. Errors: as nrtEventQuery. */
NRT_API nrtStatus nrtEventSynchronize(nrtEvent_t event);

/* Milliseconds between the completion of start and of end (both recorded,
 * completed, with timing). Errors: INVALID_HANDLE, INVALID_VALUE (ms NULL),
 * EVENT_NOT_RECORDED, NOT_READY (one has not completed), TIMING_DISABLED. */
NRT_API nrtStatus nrtEventElapsedTime(float* ms, nrtEvent_t start, nrtEvent_t end);

/* ------------------------------------------------------------------------ */
/* Kernel launch                                                             */
/* ------------------------------------------------------------------------ */

/* A kernel is host code run by the device executor. It receives the
 * runtime's private copy of the launch arguments and returns NRT_SUCCESS,
 * or a failure status after calling nrtKernelSetError to say why. */
typedef nrtStatus (*nrtKernelFn)(void* args);

/* Queues fn on stream with a private copy of argsSize bytes at args (copied
 * before this call returns, so args may live on the caller's stack). name
 * says what the kernel is (e.g. an op name and launch site); it is copied
 * as well and appears in failure messages. Returns at once; fn runs on the
 * device executor, never on the calling thread, unless
 * NEURON_LAUNCH_BLOCKING=1, in which case queued work is drained, fn runs on
 * the calling thread and its failure is returned here (KERNEL_FAILED).
 * A failing kernel does not stop the stream: later work still runs, and the
 * failure is reported once at the next synchronizing call on the stream.
 * Errors: INVALID_VALUE (fn NULL, args NULL with argsSize > 0),
 * INVALID_HANDLE. */
NRT_API nrtStatus nrtLaunchKernel(nrtStream_t stream, const char* name, nrtKernelFn fn,
                                  const void* args, size_t argsSize);

/* Called from inside a running kernel: sets the message reported with its
 * failure. Outside a kernel it returns INVALID_VALUE. */
NRT_API nrtStatus nrtKernelSetError(const char* message);

/* The stream the calling kernel runs on, or 0 outside a kernel. */
NRT_API nrtStream_t nrtKernelCurrentStream(void);

/* Runs fn on an executor thread each time it is about to sleep for lack of
 * work (after polling briefly), once per idle spell. Kernels are host code:
 * the layer above may hold per-thread resources for them (e.g. a compute
 * thread team) and releases them here, so that an idle device does not keep
 * the host's other compute threads from running at full speed. One hook per
 * process, for all devices; NULL removes it and returns once no call of
 * the old hook is still running (the runtime removes it at exit, before
 * anything is torn down). fn must not wait for device work. Never fails. */
typedef void (*nrtWorkerIdleFn)(void);
NRT_API nrtStatus nrtSetWorkerIdleHook(nrtWorkerIdleFn fn);

/* A stream holds at most NEURON_RT_QUEUE_DEPTH queued work items: a host
 * thread whose nrtLaunchWork finds it fuller than that (looked at every 64
 * launches) waits until half of them have run, as a CUDA launch blocks while
 * the launch queue is full. Before it waits it calls this hook (one per
 * process; NULL removes it) with the stream, so that the layer above can
 * record the wait. fn must not launch work or wait for device work. Kernels
 * that launch (on a worker thread) never wait. Never fails. */
typedef void (*nrtLaunchThrottleFn)(nrtStream_t stream);
NRT_API nrtStatus nrtSetLaunchThrottleHook(nrtLaunchThrottleFn fn);

/* ------------------------------------------------------------------------ */
/* Work records                                                              */
/* ------------------------------------------------------------------------ */

/* Every piece of device work — an op's kernel, a copy of any kind, a memset,
 * a compiled graph's kernel, a collective, a custom kernel — is one queued
 * work item with an identity: what it is (name, kind), where it runs (the
 * stream), who launched it (a correlation id the layer above chose, e.g. the
 * profiler's id of the CPU op) and the device buffers it reads and writes.
 * nrtLaunchKernel, nrtMemcpyAsync and nrtMemsetAsync queue work items too
 * (kinds Kernel, Copy, Memset). Tools read finished items as activity
 * records (below). */

typedef enum nrtWorkKind {
  nrtWorkKernel = 0,     /* an op's kernel                                  */
  nrtWorkCopy = 1,       /* a copy: bytes moved, or converted element-wise  */
  nrtWorkMemset = 2,     /* a memset                                        */
  nrtWorkGraph = 3,      /* a compiled graph's kernel                       */
  nrtWorkCollective = 4, /* a collective or point-to-point transfer         */
  nrtWorkCustom = 5,     /* a user's custom kernel                          */
  nrtWorkHost = 6        /* host code queued for ordering (testing aids)    */
} nrtWorkKind;

/* One device buffer a work item reads or writes. */
typedef struct nrtBufferRange {
  const void* ptr;
  size_t bytes;
} nrtBufferRange;

#define NRT_MAX_RECORDED_BUFFERS 4 /* per direction, in activity records */

typedef struct nrtWorkDesc {
  const char* name;        /* what the work is, e.g. "aten::add.out"; copied unless nameLasts */
  nrtWorkKind kind;
  uint64_t correlationId;  /* 0: the calling thread's (nrtPushCorrelationId) */
  uint64_t bytes;          /* bytes read + written (copies, memsets); 0: unknown */
  const nrtBufferRange* reads;  /* may be NULL when numReads is 0 */
  size_t numReads;
  const nrtBufferRange* writes; /* may be NULL when numWrites is 0 */
  size_t numWrites;
  struct nrtFuser* fuser;  /* NULL: the item always runs alone (see Fusion) */
  int nameLasts;           /* nonzero: name stays valid while the process runs (a
                              literal, an interned name): kept, not copied */
} nrtWorkDesc;

/* As nrtLaunchKernel, with the work item's identity. *workId (if not NULL)
 * receives the item's process-wide sequence number (from 1). Errors: as
 * nrtLaunchKernel, plus INVALID_VALUE (desc NULL, an unknown kind, buffers
 * NULL with a count > 0). */
NRT_API nrtStatus nrtLaunchWork(nrtStream_t stream, const nrtWorkDesc* desc, nrtKernelFn fn,
                                const void* args, size_t argsSize, uint64_t* workId);

/* Fusion. A work item may name a fuser (nrtWorkDesc.fuser). When the
 * executor is about to run such an item and the items queued right behind it
 * on the same stream name the same fuser, it hands their argument blocks, in
 * stream order, to the fuser in one call (at most NRT_MAX_FUSED; events,
 * waits and other items end the run). The fuser runs a prefix of them, at
 * least the first, as one pass and says how many in *ran; those items are
 * done, each with its own activity record spanning the pass (fusedWith,
 * fusedCount). A failing pass returns the status and the index of the
 * item it names in *failed, with the message set by nrtKernelSetError; the
 * failure is reported under that item's name. What the items are and when
 * they may fuse is the fuser's knowledge: the runtime only offers it the
 * queued items it is free to take together. With NEURON_LAUNCH_BLOCKING=1
 * every item runs alone. */
#define NRT_MAX_FUSED 32

typedef struct nrtFuser {
  nrtStatus (*run)(struct nrtFuser* self, void* const* args, size_t count, size_t* ran,
                   size_t* failed);
} nrtFuser;

/* The calling thread's correlation id stack: work queued by this thread
 * without an explicit id carries the top one (0 when the stack is empty).
 * Push/pop nest, like a profiler's op ranges. Pop on an empty stack is
 * INVALID_VALUE. */
NRT_API nrtStatus nrtPushCorrelationId(uint64_t id);
NRT_API nrtStatus nrtPopCorrelationId(void);
NRT_API uint64_t nrtCurrentCorrelationId(void);

/* ------------------------------------------------------------------------ */
/* Activity records                                                          */
/* ------------------------------------------------------------------------ */

/* While activity recording is on, the executor times every work item it
 * runs and keeps one record of it, until taken with nrtActivityDrain.
 * Timestamps are nanoseconds of the system clock since the Unix epoch (the
 * clock nrtActivityTimestampNs reads, and the one PyTorch's profiler uses).
 * Recording off costs one relaxed atomic load per item. Records are kept up
 * to a bound (NRT_ACTIVITY_CAPACITY); beyond it items are counted as
 * dropped, never blocking the device. */

#define NRT_ACTIVITY_CAPACITY (1u << 20)

typedef struct nrtActivityRecord {
  uint64_t workId;         /* sequence number given at launch              */
  uint64_t correlationId;  /* the launching op's id (see nrtWorkDesc)      */
  nrtStream_t stream;
  int device;
  nrtWorkKind kind;
  nrtStatus status;        /* the item's own result (KERNEL_FAILED, ...)  */
  uint64_t bytes;
  uint64_t queuedNs;       /* when the host queued it                     */
  uint64_t startNs;        /* when the device began it                    */
  uint64_t endNs;          /* when the device finished it                 */
  char name[96];
  uint32_t numReads, numWrites;  /* how many the launch gave (may exceed the recorded) */
  nrtBufferRange reads[NRT_MAX_RECORDED_BUFFERS];
  nrtBufferRange writes[NRT_MAX_RECORDED_BUFFERS];
  uint64_t fusedWith;      /* workId of the first item of the fused pass it
                              ran in; 0 when it ran alone                   */
  uint32_t fusedCount;     /* items in that pass (0 when it ran alone)     */
} nrtActivityRecord;

/* Turns recording on (nonzero) or off. Items queued while it was off are not
 * recorded even if they run later. Errors: none beyond INVALID_CONFIG. */
NRT_API nrtStatus nrtActivityEnable(int enable);

/* Moves up to capacity finished records, oldest first, into out and sets
 * *count. *dropped (if not NULL) receives how many records were lost to the
 * capacity bound since the last drain. Errors: INVALID_VALUE (out NULL with
 * capacity > 0, count NULL). */
NRT_API nrtStatus nrtActivityDrain(nrtActivityRecord* out, size_t capacity, size_t* count,
                                   uint64_t* dropped);

/* Now, on the clock of activity records. */
NRT_API uint64_t nrtActivityTimestampNs(void);

#ifdef __cplusplus
}
#endif

#endif /* NEURON_RUNTIME_H_ */
