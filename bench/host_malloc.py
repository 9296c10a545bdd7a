"""What the benches report about the host's malloc: CPU eager's tensors come
from glibc's malloc, whose first-touch page faults can be a large part of a
CPU step (see bench_train_step.py and bench_pointwise.py)."""
import os
import resource

TUNING = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def minor_faults():
    """The process's minor page faults so far (all threads)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def malloc_settings():
    """glibc malloc's tuning from the environment, as the run had it."""
    tuned = [f"{k}={os.environ[k]}" for k in TUNING if k in os.environ]
    return " ".join(tuned) if tuned else "glibc defaults (PyTorch's CPU allocator as shipped)"
