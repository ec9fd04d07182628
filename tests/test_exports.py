"""Public names: stfast.accum and stfast.parallel export every public class and function of their
submodules (``__all__``, imported on first use), ``stfast.nn`` / ``stfast.accum`` / ``stfast.parallel``
are attributes of ``import stfast`` without importing anything heavy, and every stfast import and dotted
stfast.nn / accum / parallel name in README.md, examples/ and benchmarks/ resolves."""
import ast
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import stfast

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {  # package → its submodules
    "stfast.parallel": ("slicer", "comm", "data_parallel", "components"),
    "stfast.accum": ("noise", "goodput", "window", "schedulers", "agent", "controller", "micro_batches", "env", "profile",
                     "registration"),
}
# public but not package API: the `stfast train --nproc` launcher and the profile module's command line
NOT_EXPORTED = {"stfast.parallel.data_parallel": {"launch"}, "stfast.accum.profile": {"main", "measure"}}


def _defined_here(module) -> set[str]:
    """Public classes and functions that ``module`` defines (not those it imports)."""
    return {n for n, v in vars(module).items() if not n.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v))
            and v.__module__.startswith(module.__name__)}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_name_in_all_resolves_to_its_submodules_object(package):
    pkg = importlib.import_module(package)
    assert pkg.__all__ == sorted(set(pkg.__all__)) and pkg.__all__
    owners = {}
    for sub in PACKAGES[package]:
        mod = importlib.import_module(f"{package}.{sub}")
        assert getattr(pkg, sub) is mod
        for name in getattr(mod, "__all__", ()):  # a submodule's own __all__ is the package's too
            owners.setdefault(name, mod)
        for name in _defined_here(mod) - NOT_EXPORTED.get(mod.__name__, set()):
            owners.setdefault(name, mod)
    assert sorted(owners) == pkg.__all__  # every public class and function, nothing else
    for name in pkg.__all__:
        assert getattr(pkg, name) is getattr(owners[name], name), name
        assert name in dir(pkg)
    namespace: dict = {}
    exec(f"from {package} import *", namespace)
    assert set(pkg.__all__) <= set(namespace)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        pkg.not_a_name  # noqa: B018


def test_import_stfast_reaches_the_subpackages_lazily():
    """``import stfast`` imports neither the slicer (scipy) nor the RL environments (only gymnasium's registry); the
    subpackages (stfast.nn, stfast.ops, stfast.accum, stfast.parallel) are attributes all the same."""
    code = ("import sys, stfast\n"
            "heavy = [m for m in ('stfast.accum.env', 'scipy.optimize', 'stfast.parallel.slicer') if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "from stfast.accum import WindowStats\n"
            "assert 'stfast.accum.env' not in sys.modules  # the schedulers do not need the environments\n"
            "assert stfast.nn.LSTM.__module__ == 'stfast.nn.lstm' and stfast.nn.GeoConv\n"
            "assert callable(stfast.ops.lstm_packed) and callable(stfast.ops.geo_conv_packed)  # the ops' faces\n"
            "assert stfast.accum.WindowStats is WindowStats\n"
            "assert stfast.parallel.BalancedBatchSampler is stfast.parallel.slicer.BalancedBatchSampler\n"
            "assert {'nn', 'ops', 'accum', 'parallel', 'load_model', 'OutsideTrainingArea'} <= set(dir(stfast))\n"
            "assert not [n for n in dir(stfast) if '.' in n], dir(stfast)  # no 'train.trained' (issue 62)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stderr
    # the acceptance line of issue 23: importing stfast.accum after gymnasium registers the environments
    code = ("import stfast, gymnasium as g; stfast.nn.LSTM; import stfast.accum; g.make('stfast/AccumulationSim-v0');"
            "g.spec('stfast/AccumulationLive-v0')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        stfast.not_a_name  # noqa: B018


def _documented_imports() -> dict[str, set[str]]:
    """{module: names} of every ``from stfast… import`` / ``import stfast…`` in examples/*.py,
    benchmarks/*.py and README.md's python blocks."""
    sources = [p.read_text() for p in sorted([*ROOT.glob("examples/*.py"), *ROOT.glob("benchmarks/*.py")])]
    sources += re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    found: dict[str, set[str]] = {}
    for src in sources:
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "stfast":
                found.setdefault(node.module, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "stfast":
                        found.setdefault(a.name, set())
    return found


def test_readme_examples_and_benchmarks_imports_resolve():
    found = _documented_imports()
    assert {"stfast.accum.schedulers", "stfast.parallel.slicer", "stfast.nn"} <= set(found)  # the scan sees them
    for module, names in sorted(found.items()):
        mod = importlib.import_module(module)
        for name in names:
            assert hasattr(mod, name) or importlib.import_module(f"{module}.{name}"), f"from {module} import {name}"


def test_dotted_names_in_readme_examples_and_benchmarks_resolve():
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *ROOT.glob("examples/*.py"), *ROOT.glob("benchmarks/*.py")])
    dotted = set(re.findall(r"\bstfast\.(?:nn|accum|parallel)(?:\.[A-Za-z_]\w*)*", text))
    assert {"stfast.accum.WindowStats", "stfast.parallel.slicer.BalancedBatchSampler", "stfast.nn.LSTM"} <= dotted
    for ref in sorted(dotted):
        obj = stfast
        for part in ref.split(".")[1:]:
            assert hasattr(obj, part), ref  # reached from `import stfast` alone, through the lazy attributes
            obj = getattr(obj, part)
