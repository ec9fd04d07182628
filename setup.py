"""Build script. Metadata lives in pyproject.toml; this file drives the native build: CMakeLists.txt
compiles csrc/ into the extensions ``stfast._C`` (CPU kernels always; CUDA kernels when the installed
torch is a CUDA build and nvcc is found), ``stfast._slicer`` (the slicer's partitioners) and ``stfast._emu``
(the CUDA kernels run by the CUDA emulator on the CPU, for tests). Install with ``pip install --no-build-isolation .`` (or
``-e .``) so that the extension is built against the torch that will run it.

Environment:
  STFAST_CUDA=0|1         force the CUDA kernels off / on (default: detect; never torch.cuda.is_available())
  MAX_JOBS=N              parallel compile jobs (default: number of CPUs)
  TORCH_CUDA_ARCH_LIST    CUDA architectures (default "8.0;9.0+PTX")
  STFAST_CPU_NATIVE=0     compile the CPU kernels for the baseline x86-64 ISA instead of -march=native
  CUDA_HOME               CUDA toolkit (default: the one holding nvcc on PATH, else /usr/local/cuda)
"""
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
DEFAULT_ARCH_LIST = "8.0;9.0+PTX"


def _log(msg: str) -> None:
    print(f"stfast build: {msg}", flush=True)


def _find_nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    default = Path("/usr/local/cuda/bin/nvcc")
    if default.is_file():
        return str(default)
    found = shutil.which("nvcc")
    return str(Path(found).resolve()) if found else None


def _nvidia_wheel_dirs(torch_dir: Path) -> tuple[list[str], str | None]:
    """Include dirs of the nvidia-* wheels that come with CUDA torch (cuBLAS, cuSPARSE, cuDNN, NCCL
    headers are not in every toolkit) and libnvrtc, which CMake's Torch config cannot find there."""
    site = torch_dir.parent
    includes = sorted(glob.glob(str(site / "nvidia" / "*" / "include")))
    nvrtc = sorted(glob.glob(str(site / "nvidia" / "*" / "lib" / "libnvrtc.so*")))
    return includes, (nvrtc[0] if nvrtc else None)


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """build_ext that configures and builds CMakeLists.txt with ninja (when available)."""

    def build_extension(self, ext: Extension) -> None:
        import torch
        import torch.utils

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        want = os.environ.get("STFAST_CUDA", "").strip()
        nvcc = _find_nvcc()
        if want not in ("", "0", "1"):
            raise RuntimeError(f"STFAST_CUDA must be 0 or 1, got {want!r}")
        if want == "0":
            cuda, why = False, "STFAST_CUDA=0"
        elif torch.version.cuda is None:
            if want == "1":
                raise RuntimeError(f"STFAST_CUDA=1 but torch {torch.__version__} is a CPU-only build")
            cuda, why = False, f"torch {torch.__version__} has no CUDA"
        elif nvcc is None:
            if want == "1":
                raise RuntimeError("STFAST_CUDA=1 but nvcc was not found (set CUDA_HOME)")
            cuda, why = False, "nvcc not found"
        else:
            cuda, why = True, f"torch {torch.__version__} (CUDA {torch.version.cuda}) and {nvcc}"
        _log(("building CPU and CUDA kernels: " if cuda else "building CPU kernels only: ") + why)

        tag = f"{sys.implementation.cache_tag}-torch{torch.__version__}-{'cuda' if cuda else 'cpu'}"
        build_dir = ROOT / "build" / f"cmake-{tag}"
        build_dir.mkdir(parents=True, exist_ok=True)
        torch_dir = Path(torch.__file__).resolve().parent
        version = self.distribution.get_version()
        args = [
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DSTFAST_OUTPUT_DIR={out_dir}",
            f"-DSTFAST_VERSION={version}",
            f"-DSTFAST_TORCH_VERSION={torch.__version__}",
            f"-DSTFAST_CUDA={'ON' if cuda else 'OFF'}",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DSTFAST_TORCH_DIR={torch_dir}",
            f"-DSTFAST_TORCH_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-DSTFAST_CPU_NATIVE={'OFF' if os.environ.get('STFAST_CPU_NATIVE') == '0' else 'ON'}",
        ]
        env = dict(os.environ)
        if cuda:
            cuda_home = str(Path(nvcc).parent.parent)
            includes, nvrtc = _nvidia_wheel_dirs(torch_dir)
            arch = os.environ.get("TORCH_CUDA_ARCH_LIST") or DEFAULT_ARCH_LIST
            env["TORCH_CUDA_ARCH_LIST"] = arch
            env.setdefault("CUDA_HOME", cuda_home)
            args += [f"-DCMAKE_CUDA_COMPILER={nvcc}", f"-DCUDAToolkit_ROOT={cuda_home}",
                     f"-DCUDA_TOOLKIT_ROOT_DIR={cuda_home}",
                     f"-DSTFAST_CUDA_VERSION={torch.version.cuda}",
                     f"-DSTFAST_CUDA_EXTRA_INCLUDES={';'.join(includes)}"]
            if nvrtc:
                args.append(f"-DCUDA_nvrtc_LIBRARY={nvrtc}")
            _log(f"TORCH_CUDA_ARCH_LIST={arch}")
        if shutil.which("ninja"):
            args.append("-GNinja")
        jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1)
        _log(f"cmake in {build_dir} (MAX_JOBS={jobs})")
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build_dir), *args], check=True, env=env)
        target = ext.name.rsplit(".", 1)[-1]  # one CMake target per extension module (_C, _slicer)
        subprocess.run(["cmake", "--build", str(build_dir), "--parallel", jobs, "--target", target], check=True, env=env)


def native_extensions() -> list:
    """The extension modules built from CMakeLists.txt: stfast._C (the ops), stfast._slicer (the
    slicer's partitioners, no torch), stfast._emu (the CUDA emulator's ops, CPU code) and stfast._prep (the
    preprocessing scans, no torch)."""
    names = ["stfast._C", "stfast._slicer", "stfast._emu", "stfast._prep"]
    return [CMakeExtension(n) for n in names] if (ROOT / "CMakeLists.txt").is_file() else []


setup(ext_modules=native_extensions(), cmdclass={"build_ext": CMakeBuild})
