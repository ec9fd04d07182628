"""Public names of a package that are imported on first use (PEP 562 module ``__getattr__``).

``from stfast.parallel import BalancedBatchSampler`` then imports only the submodule that defines the
name, so importing a package stays as cheap as before: the slicer's scipy, the RL environments'
gymnasium and the component graph load only when something asks for them (stfast.models imports
stfast.parallel.components.graph, and would otherwise pull in all of stfast.parallel).
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]]) -> tuple[list[str], Callable, Callable]:
    """``(__all__, __getattr__, __dir__)`` for the package named ``package``, whose ``exports`` map each
    submodule (its name relative to the package) to the public names it defines. ``__all__`` lists the
    names, sorted; ``__getattr__`` resolves a name from its submodule (imported then, the value cached
    on the package) and each direct submodule (a name without a dot) by its name, and raises AttributeError
    for anything else; ``__dir__`` lists the package's attributes, the names and the direct submodules (a
    deeper submodule such as ``"train.trained"`` only says where names live: it is no attribute).
    Raises ValueError when two submodules export the same name."""
    where: dict[str, str] = {}
    for sub, names in exports.items():
        for name in names:
            if where.setdefault(name, sub) != sub:
                raise ValueError(f"{package}: {name!r} is exported by both .{where[name]} and .{sub}")

    submodules = {sub for sub in exports if "." not in sub}

    def __getattr__(name: str):
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")  # the import sets it on the package
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        setattr(sys.modules[package], name, value)  # later look-ups are plain attributes
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where) | submodules)

    return sorted(where), __getattr__, __dir__
