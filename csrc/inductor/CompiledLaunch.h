// Compiled kernels on the device: Inductor's C++ kernels, queued as work
// items on a neuron stream, as CUDA queues Triton kernels on its stream.
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

extern "C" {

// A kernel's identity for tools: "<graph>/<kernel>" and the device it runs
// on. Interned: the same name and device give the same handle, valid for the
// life of the process.
const void* torchneuron_compiled_kernel(const char* name, int device);

// Queues run(args) on the current stream of the kernel's device (`size`
// bytes of args are copied). Returns 0, or -1 with an error message in
// `error` (the launch could not be queued: bad device, a device that failed
// earlier, ...). A failure of the kernel itself surfaces as for any work
// item: at the next synchronizing call, naming the kernel.
int torchneuron_launch_compiled(const void* kernel, void (*run)(const void*), const void* args,
                                size_t size, char* error, size_t errorSize);

}  // extern "C"
