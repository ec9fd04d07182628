"""Build script. Metadata lives in pyproject.toml; this file exists to drive the native build
(csrc/ → stfast._C through CMake) once csrc/ exists. Install with
`pip install --no-build-isolation .` so the extension is built against the torch that will run it."""
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def native_extensions() -> list:
    """Extension modules to build: none until csrc/CMakeLists.txt exists (pure-Python package)."""
    if not (ROOT / "CMakeLists.txt").is_file():
        return []
    raise RuntimeError("CMakeLists.txt found but setup.py does not yet know how to build it")


setup(ext_modules=native_extensions())
