"""The native build: build_info() and the errors import and dispatch give when the build does not fit."""
import fnmatch
import subprocess
from pathlib import Path

import pytest
import torch

import stfast


def test_build_info_fields():
    info = stfast.build_info()
    assert set(info) == {"stfast_version", "torch_version", "cuda", "cuda_version", "nccl"}
    assert info["stfast_version"] == stfast.__version__
    assert info["torch_version"] == torch.__version__
    assert isinstance(info["cuda"], bool) and isinstance(info["nccl"], bool)
    assert info["nccl"] is (info["cuda"] and hasattr(stfast._C, "NcclCommunicator"))  # NCCL only with CUDA
    if info["cuda"]:
        assert info["cuda_version"] == torch.version.cuda
    else:
        assert info["cuda_version"] is None


def test_ops_registered():
    import stfast.ops  # noqa: F401  (the extension loads with the ops' Python face, not with `import stfast`)

    assert hasattr(torch.ops.stfast, "geo_conv_forward") and hasattr(torch.ops.stfast, "geo_conv_backward")
    has_cuda_kernel = torch._C._dispatch_has_kernel_for_dispatch_key("stfast::geo_conv_forward", "CUDA")
    assert has_cuda_kernel  # the real kernel, or the CPU-only build's explanatory stub


def test_torch_version_mismatch_is_explained(monkeypatch):
    monkeypatch.setattr(stfast._C, "torch_version", "0.0.1")
    with pytest.raises(ImportError, match=r"built against torch 0\.0\.1 but torch .* is imported.*"
                                          r"pip install --no-build-isolation -e \."):
        stfast._load_extension()


def test_missing_extension_is_explained(monkeypatch):
    import sys

    monkeypatch.delattr(stfast, "_C")
    monkeypatch.setitem(sys.modules, "stfast._C", None)
    with pytest.raises(ImportError, match=r"stfast\._C is missing.*pip install --no-build-isolation -e \."):
        stfast._load_extension()


@pytest.mark.skipif(stfast.build_info()["cuda"], reason="CPU-only build's message")
def test_cpu_only_build_message():
    op = torch.ops.stfast.geo_conv_backward.default
    args = [torch.zeros(1)] * 7
    with pytest.raises(RuntimeError, match="stfast was built without CUDA support"):
        op.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA), *args)


def test_every_data_file_of_the_package_is_installed():
    """A regular (non-editable) install copies only the .py files and the package-data patterns of
    pyproject.toml: each other file git tracks under stfast/ must match one (a missing profile JSON broke
    `--accumulation rl` in `make demo`'s environment while the editable test environment had it)."""
    tomllib = pytest.importorskip("tomllib")  # Python ≥ 3.11
    root = Path(__file__).resolve().parents[1]
    tracked = subprocess.run(["git", "ls-files", "stfast"], cwd=root, capture_output=True, text=True, check=True)
    data = [p for p in tracked.stdout.split() if not p.endswith(".py")]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for path in data:
        package, name = path.rsplit("/", 1)
        assert any(fnmatch.fnmatch(name, pat) for pat in patterns.get(package.replace("/", "."), [])), path
    assert "stfast/accum/profile_deeptte_cpu.json" in data


def test_a_source_tree_without_its_native_modules_says_so(tmp_path):
    """Issue 62: Python run from a checkout's root imports its source tree (no compiled modules there with a
    regular install), and the error advised rebuilding; it says now that this stfast is the source tree, and to
    run from another folder or build in place."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    tree = tmp_path / "checkout"
    shutil.copytree(root / "stfast", tree / "stfast", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (tree / "setup.py").write_text("# a checkout's setup.py\n")
    # as in an environment where stfast is a regular install: no editable finder mapping its modules to a checkout
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
            "import stfast.data.resample")
    r = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "is the source tree at" in last and "run Python from another folder" in last, last
