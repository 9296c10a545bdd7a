// Compiled kernels on the device: Inductor's C++ kernels and users' custom
// kernels (torchneuron.kernels, the kernel ABI of torchneuron_kernel.h),
// queued as work items on a neuron stream, as CUDA queues its kernels.
//
// A kernel module built by torchneuron.compiler (kernels.py) does not call
// its kernel: its Python entry packs the kernel's arguments (device pointers,
// sizes) into a struct and hands that, with a function that unpacks and
// calls the kernel, to torchneuron_launch_compiled. The launch copies the
// bytes into a work item on the current stream of the kernel's device and
// returns: the host never waits for the device.
//
// A C ABI, because the kernel modules are plain C++ compiled by Inductor
// (no torch headers): they receive torchneuron_launch_compiled's address at
// load time, and each kernel's handle as their first argument.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// A kernel's identity for tools: "<graph>/<kernel>" and the device it runs
// on. Interned: the same name and device give the same handle, valid for the
// life of the process.
const void* torchneuron_compiled_kernel(const char* name, int device);

// A custom kernel's identity: work items of kind custom, named `name` as
// given (the op's name, e.g. "mylib::rms_norm"). Interned likewise.
const void* torchneuron_custom_kernel(const char* name, int device);

// Queues run(args) on the current stream of the kernel's device (`size`
// bytes of args are copied). Returns 0, or -1 with an error message in
// `error` (the launch could not be queued: bad device, a device that failed
// earlier, ...). A failure of the kernel itself surfaces as for any work
// item: at the next synchronizing call, naming the kernel.
int torchneuron_launch_compiled(const void* kernel, void (*run)(const void*), const void* args,
                                size_t size, char* error, size_t errorSize);

// The kernel ABI's parallel-for: body(lo, hi, ctx) over chunks of
// [begin, end) of at least `grain` indices, on the device's compute threads
// (ATen's intra-op pool, as the device's own kernels use), returning when all
// chunks have run. Safe to call from inside a kernel.
void torchneuron_parallel_for(int64_t begin, int64_t end, int64_t grain,
                              void (*body)(int64_t, int64_t, void*), void* ctx);

}  // extern "C"
