"""OpenMP parallel regions per training step, by the code that opened them.

    python bench/parallel_regions.py                       (llama on neuron)
    python bench/parallel_regions.py --models gpt,resnet18,llama --device cpu

Every parallel region wakes the OpenMP team of the thread that opens it, and
a woken team's threads spin for a while afterwards. On a 2-core machine the
device's spinning team takes the core the host thread needs to issue work.
Serial-equivalent kernels (csrc/core/SerialCompute.h) run small kernels on
one thread where that keeps their bits; this counts the regions a step
still opens and names their callers: MKL's sgemm, ATen's loops and kernels,
the device's own passes. A step that opens none leaves the team asleep (the
tiny Llama's, after its first steps; 77 per step before serial kernels).

How: a small preloaded library (compiled here with the system's cc) wraps
libgomp's GOMP_parallel and counts the calls that ask for more than one
thread, by return address. The step runs in a child process under it;
counting is reset after warm-up steps and dumped after the timed ones.
Callers that are local symbols are named through addr2line.
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
typedef void (*par_fn)(void (*)(void*), void*, unsigned, unsigned);
extern int omp_get_max_threads(void);
#define MAXC 1024
static void* callers[MAXC];
static long counts[MAXC];
static int n;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
void GOMP_parallel(void (*fn)(void*), void* data, unsigned threads, unsigned flags) {
  static par_fn real;
  if (!real) real = (par_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
  if (threads != 1 && omp_get_max_threads() > 1) {
    void* ra = __builtin_return_address(0);
    pthread_mutex_lock(&mu);
    int i = 0;
    while (i < n && callers[i] != ra) i++;
    if (i == n && n < MAXC) callers[n++] = ra;
    if (i < MAXC) counts[i]++;
    pthread_mutex_unlock(&mu);
  }
  real(fn, data, threads, flags);
}
void regions_reset(void) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < n; i++) counts[i] = 0;
  pthread_mutex_unlock(&mu);
}
int regions_dump(const char* path) {
  FILE* f = fopen(path, "w");
  if (!f) return -1;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < n; i++) {
    if (!counts[i]) continue;
    Dl_info d;
    int ok = dladdr(callers[i], &d);
    fprintf(f, "%ld\t%s\t%s\t0x%lx\n", counts[i], ok && d.dli_sname ? d.dli_sname : "?",
            ok && d.dli_fname ? d.dli_fname : "?",
            ok ? (unsigned long)((char*)callers[i] - (char*)d.dli_fbase) : 0ul);
  }
  pthread_mutex_unlock(&mu);
  fclose(f);
  return 0;
}
"""


def build_shim(workdir):
    src, lib = os.path.join(workdir, "regions.c"), os.path.join(workdir, "regions.so")
    with open(src, "w") as f:
        f.write(SHIM)
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-o", lib, src,
                    "-ldl", "-lgomp", "-lpthread"], check=True)
    return lib


def child(name, device, steps, out):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_compile import MODELS, setup
    step = setup(MODELS[name], device, compiled=False)  # eager; each step synchronizes
    for _ in range(3):
        step()
    shim = ctypes.CDLL(None)
    shim.regions_reset()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    ms = (time.perf_counter() - start) / steps * 1e3
    shim.regions_dump(out.encode())
    print(f"{ms:.2f}")


def caller_name(sym, lib, offset):
    """The caller's function: its symbol, or for a local one the outermost
    function of addr2line's inline chain (the code that inlined
    at::parallel_for)."""
    if sym == "?" and lib != "?":
        lines = subprocess.run(["addr2line", "-f", "-i", "-e", lib, offset], capture_output=True,
                               text=True).stdout.splitlines()
        functions = lines[0::2]
        sym = functions[-1] if functions else "?"
    return subprocess.run(["c++filt", sym], capture_output=True, text=True).stdout.strip() or sym


def study(name, device, steps, lib, workdir):
    out = os.path.join(workdir, f"{name}.{device}.txt")
    env = dict(os.environ, LD_PRELOAD=lib)
    ms = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name, device,
                         str(steps), out], env=env, capture_output=True, text=True, check=True
                        ).stdout.strip().splitlines()[-1]
    rows = {}
    for line in open(out):
        count, sym, path, offset = line.rstrip("\n").split("\t")
        key = (caller_name(sym, path, offset), os.path.basename(path))
        rows[key] = rows.get(key, 0) + int(count)
    total = sum(rows.values()) / steps
    print(f"\n{name} on {device}: {total:.1f} parallel regions per step "
          f"({ms} ms per step under the counter)")
    for (caller, lib_name), count in sorted(rows.items(), key=lambda kv: -kv[1]):
        print(f"  {count / steps:7.2f}  {lib_name[:24]:24s} {caller[:110]}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="llama")
    p.add_argument("--device", default="neuron", choices=["neuron", "cpu"])
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        lib = build_shim(workdir)
        for name in args.models.split(","):
            study(name, args.device, args.steps, lib, workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
