"""What to say when a native module of stfast (``_C``, ``_prep``) does not import. No import of stfast's layers: the
data layer uses it too."""
from pathlib import Path

REBUILD = "pip install --no-build-isolation -e ."


def native_missing(module: str, error: Exception) -> str:
    """What to do about a native module (``_C``, ``_prep``) that does not import: where stfast is imported from
    its source tree with no built module in it (a checkout's root is Python's working folder, which shadows a
    regular install such as ``make setup``'s), say so; else how to build it here."""
    pkg = Path(__file__).resolve().parent
    if (pkg.parent / "setup.py").is_file() and not any(pkg.glob(f"{module}.*.so")):
        return (f"stfast's native module stfast.{module} is missing ({error}): this stfast is the source tree at "
                f"{pkg.parent}, not built in place, which Python takes before an installed stfast from this folder; "
                f"run Python from another folder, or build here: {REBUILD}")
    return (f"stfast's native module stfast.{module} is missing or does not load ({error}); build it in this "
            f"environment: run {REBUILD} (from the stfast checkout)")
