"""Builds the backend with CMake (Ninja) and places the libraries in the package.

    pip install -e . --no-build-isolation      # editable, uses the installed torch

Layout after the build:
    torchneuron/_C.<abi>.so                  Python bindings (rpath $ORIGIN/lib)
    torchneuron/lib/libtorchneuron_backend.so
    torchneuron/lib/libneuron_runtime.so

Environment:
    TORCHNEURON_BUILD_DIR   CMake build directory (default: build/py<ver>)
    TORCHNEURON_BUILD_TYPE  CMake build type (default: RelWithDebInfo)
    MAX_JOBS                parallel compile jobs (default: 2)
"""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
PACKAGE = "torchneuron"


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def run(self):
        # Building must not load a previously installed torchneuron through
        # torch's backend autoload (it may be stale, or point at a deleted
        # checkout).
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        import torch
        from torch.utils import cpp_extension

        build_dir = Path(
            os.environ.get(
                "TORCHNEURON_BUILD_DIR",
                ROOT / "build" / f"py{sys.version_info[0]}{sys.version_info[1]}",
            )
        ).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        build_type = os.environ.get("TORCHNEURON_BUILD_TYPE", "RelWithDebInfo")
        jobs = os.environ.get("MAX_JOBS", "2")
        configure = [
            "cmake",
            "-S", str(ROOT),
            "-B", str(build_dir),
            "-G", "Ninja",
            f"-DCMAKE_BUILD_TYPE={build_type}",
            "-DNEURON_BUILD_BACKEND=ON",
            "-DNEURON_BUILD_TESTS=OFF",
            "-DNEURON_BUILD_BENCH=OFF",
            f"-DTORCH_INCLUDE_DIRS={';'.join(cpp_extension.include_paths())}",
            f"-DTORCH_LIBRARY_DIRS={';'.join(cpp_extension.library_paths())}",
            f"-DTORCH_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-DPython_EXECUTABLE={sys.executable}",
        ]
        subprocess.check_call(configure)
        subprocess.check_call(
            ["cmake", "--build", str(build_dir), "-j", jobs,
             "--target", "torchneuron_backend", "torchneuron_C"]
        )
        self._place(build_dir)

    def _place(self, build_dir: Path):
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        found = {}
        for name in ("libneuron_runtime.so", "libtorchneuron_backend.so", f"_C{suffix}"):
            hits = [p for p in build_dir.rglob(name) if p.is_file()]
            if not hits:
                raise RuntimeError(f"build produced no {name} under {build_dir}")
            found[name] = max(hits, key=lambda p: p.stat().st_mtime)
        destinations = [ROOT / PACKAGE]
        if not (self.inplace or getattr(self, "editable_mode", False)):
            destinations.append(Path(self.build_lib) / PACKAGE)
        for dest in destinations:
            (dest / "lib").mkdir(parents=True, exist_ok=True)
            for name, path in found.items():
                target = dest / name if name.startswith("_C") else dest / "lib" / name
                tmp = target.with_suffix(target.suffix + ".tmp")
                shutil.copy2(path, tmp)
                os.replace(tmp, target)

    def get_outputs(self):
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        base = Path(self.build_lib) / PACKAGE
        return [str(base / f"_C{suffix}"),
                str(base / "lib" / "libtorchneuron_backend.so"),
                str(base / "lib" / "libneuron_runtime.so")]


# The build places its libraries here; setuptools wants the package directory
# (torchneuron.lib, declared in pyproject.toml) to exist from the start.
(ROOT / PACKAGE / "lib").mkdir(exist_ok=True)

setup(
    ext_modules=[CMakeExtension(f"{PACKAGE}._C")],
    cmdclass={"build_ext": CMakeBuild},
)
