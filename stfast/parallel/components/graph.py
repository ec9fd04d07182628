"""A model's component graph: named components, the named values they consume and produce.

A model that wants component parallelism declares its forward as a short DAG (``ComponentGraph``):
each :class:`Component` is a callable over named input values returning named output values, and the
graph says how a batch becomes the source values and how the final values become the model's output.
The graph knows nothing of devices, streams or ranks; :class:`~stfast.parallel.components.plan.ComponentPlan`
places it and :class:`~stfast.parallel.components.executor.ComponentExecutor` runs it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["Component", "ComponentGraph"]


@dataclass(frozen=True)
class Component:
    """One node of a component graph.

    ``fn(*[values[n] for n in inputs])`` returns one tensor (one output) or a tuple of ``len(outputs)``
    tensors. ``modules``: the modules holding the component's parameters (moved to its device by the
    executor; their parameters are the component's). Raises ValueError on an empty name, no outputs or
    a name repeated among its inputs or outputs."""

    name: str
    fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    modules: tuple[nn.Module, ...] = ()

    def __post_init__(self):
        if not self.name:
            raise ValueError("component name must be a non-empty string")
        if not self.outputs:
            raise ValueError(f"component {self.name!r} has no outputs")
        for what, names in (("inputs", self.inputs), ("outputs", self.outputs)):
            if len(set(names)) != len(names):
                raise ValueError(f"component {self.name!r} repeats a name in its {what}: {list(names)}")

    def parameters(self) -> list[nn.Parameter]:
        return [p for m in self.modules for p in m.parameters()]

    def __call__(self, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.fn(*values)
        out = out if isinstance(out, tuple) else (out,)
        if len(out) != len(self.outputs):
            raise ValueError(f"component {self.name!r} returned {len(out)} values, declared {len(self.outputs)} "
                             f"outputs {list(self.outputs)}")
        return out


@dataclass
class ComponentGraph:
    """A forward pass as a DAG of components.

    - ``components``: in any order; every value is produced by exactly one component or is a source.
    - ``sources``: names of the values ``make_inputs(batch)`` returns (batch-major tensors: dim 0 = B trips).
    - ``outputs``: names of the values ``make_output(values)`` needs (sources or produced values).
    - ``make_inputs(batch) -> {name: tensor}``; ``make_output({name: tensor}) -> model output``.
    - ``host_sources``: sources that stay where ``make_inputs`` put them (CPU tensors a component reads on
      the host, e.g. sequence lengths that size its kernels' launches), never moved to a component's device.

    Raises ValueError naming the component on: duplicate component names, a value produced twice (or
    produced and also a source), an input nobody produces, an output nobody produces, a cycle.
    """

    components: Sequence[Component]
    sources: tuple[str, ...]
    outputs: tuple[str, ...]
    make_inputs: Callable[[object], Mapping[str, torch.Tensor]]
    make_output: Callable[[Mapping[str, torch.Tensor]], object]
    host_sources: tuple[str, ...] = ()
    producer: dict[str, str] = field(init=False)  # value name → component name
    order: tuple[str, ...] = field(init=False)  # component names, topologically sorted (stable)

    def __post_init__(self):
        stray = [v for v in self.host_sources if v not in self.sources]
        if stray:
            raise ValueError(f"host_sources {stray} are not sources {list(self.sources)}")
        names = [c.name for c in self.components]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"component names must be unique; repeated: {sorted(dup)}")
        self.by_name = {c.name: c for c in self.components}
        self.producer = {}
        for c in self.components:
            for v in c.outputs:
                if v in self.sources:
                    raise ValueError(f"component {c.name!r} produces {v!r}, which is also a source value")
                if v in self.producer:
                    raise ValueError(f"value {v!r} is produced by both {self.producer[v]!r} and {c.name!r}")
                self.producer[v] = c.name
        for c in self.components:
            for v in c.inputs:
                if v not in self.producer and v not in self.sources:
                    raise ValueError(f"component {c.name!r} consumes {v!r}, which no component produces "
                                     f"and is not a source {list(self.sources)}")
        for v in self.outputs:
            if v not in self.producer and v not in self.sources:
                raise ValueError(f"graph output {v!r} is produced by no component and is not a source")
        self.order = self._topological_order()

    def _topological_order(self) -> tuple[str, ...]:
        done: list[str] = []
        left = [c.name for c in self.components]
        while left:
            ready = [n for n in left if all(p in done for p in self.dependencies(n))]
            if not ready:
                raise ValueError(f"the component graph has a cycle among {left}")
            done += ready
            left = [n for n in left if n not in ready]
        return tuple(done)

    def component(self, name: str) -> Component:
        if name not in self.by_name:
            raise ValueError(f"unknown component {name!r}; the graph has {list(self.by_name)}")
        return self.by_name[name]

    def dependencies(self, name: str) -> list[str]:
        """Components whose outputs ``name`` consumes (in input order, without repeats)."""
        deps = [self.producer[v] for v in self.component(name).inputs if v in self.producer]
        return list(dict.fromkeys(deps))

    def consumers(self, value: str) -> list[str]:
        """Components consuming ``value``, in topological order."""
        return [n for n in self.order if value in self.by_name[n].inputs]

    def levels(self) -> dict[str, int]:
        """Depth of each component: 0 for components fed only by sources, else 1 + the deepest
        dependency. Components of one level are independent of each other."""
        lv: dict[str, int] = {}
        for n in self.order:
            lv[n] = 1 + max((lv[d] for d in self.dependencies(n)), default=-1)
        return lv

    def critical_path(self, cost: Mapping[str, float]) -> tuple[float, list[str]]:
        """Longest path through the DAG under per-component ``cost`` (e.g. seconds): (length, names).
        The time of one forward (or backward) with unlimited concurrency cannot be below it."""
        best: dict[str, tuple[float, list[str]]] = {}
        for n in self.order:
            prev = max((best[d] for d in self.dependencies(n)), default=(0.0, []), key=lambda t: t[0])
            best[n] = (prev[0] + float(cost[n]), prev[1] + [n])
        return max(best.values(), key=lambda t: t[0])
