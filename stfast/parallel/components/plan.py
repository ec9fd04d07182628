"""``ComponentPlan``: where each component of a :class:`ComponentGraph` runs — a stage (a device in one
process, or a rank of the component-parallel group across processes) and, on that stage, a lane (a
CUDA stream on a GPU; a worker thread on the CPU when the executor uses threads)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .graph import ComponentGraph

__all__ = ["ComponentPlan", "Placement"]


@dataclass(frozen=True)
class Placement:
    """``stage``: index into the plan's stages (≥ 0); ``lane``: stream (CUDA) or thread (CPU) index on
    that stage (≥ 0). Components on one lane run in topological order; different lanes may overlap."""

    stage: int = 0
    lane: int = 0


class ComponentPlan:
    """Component → :class:`Placement` for every component of ``graph``; ``devices[s]`` is stage s's
    device (across processes: the device each rank uses; rank s of the component-parallel group runs
    stage s).

    Data must flow to the same or a later stage (the pipeline's order). Raises ValueError naming the
    component on: a component without a placement, a placement for an unknown component, a negative
    stage or lane, a stage without a device, a component on an earlier stage than one it consumes from.
    """

    def __init__(self, graph: ComponentGraph, placement: Mapping[str, Placement],
                 devices: Sequence[torch.device | str]):
        self.graph = graph
        self.devices = [torch.device(d) for d in devices]
        if not self.devices:
            raise ValueError("a ComponentPlan needs at least one stage device")
        for name in placement:
            if name not in graph.by_name:
                raise ValueError(f"plan places unknown component {name!r}; the graph has {list(graph.order)}")
        for name in graph.order:
            if name not in placement:
                raise ValueError(f"component {name!r} has no placement in the plan")
            p = placement[name]
            if not isinstance(p, Placement):
                raise TypeError(f"placement of component {name!r} must be a Placement, got {type(p).__name__}")
            if not 0 <= p.stage < len(self.devices):
                raise ValueError(f"component {name!r} is placed on stage {p.stage}; the plan has stages "
                                 f"0..{len(self.devices) - 1} (one per device)")
            if p.lane < 0:
                raise ValueError(f"component {name!r} is placed on lane {p.lane}; lanes are ≥ 0")
        for name in graph.order:
            for dep in graph.dependencies(name):
                if placement[dep].stage > placement[name].stage:
                    raise ValueError(f"component {name!r} on stage {placement[name].stage} consumes from "
                                     f"{dep!r} on the later stage {placement[dep].stage}: data must flow to "
                                     "the same or a later stage")
        self.placement = {n: placement[n] for n in graph.order}

    # ---------------------------------------------------------------- constructors
    @classmethod
    def sequential(cls, graph: ComponentGraph, device: torch.device | str = "cpu") -> ComponentPlan:
        """Every component on one device, one lane: the plain forward's schedule."""
        return cls(graph, {n: Placement() for n in graph.order}, [device])

    @classmethod
    def concurrent(cls, graph: ComponentGraph, device: torch.device | str = "cpu") -> ComponentPlan:
        """One device; independent components on different lanes: the i-th component of each level of
        the DAG (:meth:`ComponentGraph.levels`) on lane i. DeepTTE: attr ∥ geo_conv, then lstm, then
        entire ∥ local."""
        lv = graph.levels()
        seen: dict[int, int] = {}
        placement = {}
        for n in graph.order:
            placement[n] = Placement(0, seen.get(lv[n], 0))
            seen[lv[n]] = seen.get(lv[n], 0) + 1
        return cls(graph, placement, [device])

    @classmethod
    def staged(cls, graph: ComponentGraph, stages: Sequence[Sequence[str]], devices: Sequence[torch.device | str],
               concurrent: bool = False) -> ComponentPlan:
        """``stages[s]``: the component names on stage s (device ``devices[s]``); with ``concurrent``
        independent components of a stage get lanes as in :meth:`concurrent`. Raises ValueError when
        stages and devices differ in number, or a component is on two stages (besides the checks of
        the constructor)."""
        if len(stages) != len(devices):
            raise ValueError(f"{len(stages)} stages but {len(devices)} devices; give one device per stage")
        stage_of: dict[str, int] = {}
        for s, names in enumerate(stages):
            for n in names:
                if n in stage_of:
                    raise ValueError(f"component {n!r} is on stage {stage_of[n]} and on stage {s}")
                stage_of[n] = s
        lanes = {n: 0 for n in stage_of}
        if concurrent:
            lv = graph.levels()
            used: dict[tuple[int, int], int] = {}
            for n in graph.order:
                if n in stage_of:
                    key = (stage_of[n], lv[n])
                    lanes[n] = used.get(key, 0)
                    used[key] = lanes[n] + 1
        return cls(graph, {n: Placement(stage_of[n], lanes[n]) for n in stage_of}, devices)

    @classmethod
    def split_after(cls, graph: ComponentGraph, last_of_stage0: str, devices: Sequence[torch.device | str],
                    concurrent: bool = False) -> ComponentPlan:
        """Two stages: the components up to and including ``last_of_stage0`` in topological order on
        stage 0, the rest on stage 1 (DeepTTE, ``"lstm"``: attr + geo-conv + LSTM | entire + local)."""
        i = graph.order.index(graph.component(last_of_stage0).name) + 1
        return cls.staged(graph, [graph.order[:i], graph.order[i:]], devices, concurrent)

    # ---------------------------------------------------------------- queries
    @property
    def n_stages(self) -> int:
        return len(self.devices)

    def stage_of(self, name: str) -> int:
        return self.placement[name].stage

    def lanes(self) -> list[tuple[int, int]]:
        """The (stage, lane) pairs in use, sorted."""
        return sorted({(p.stage, p.lane) for p in self.placement.values()})

    def stage_components(self, stage: int) -> list[str]:
        return [n for n in self.graph.order if self.placement[n].stage == stage]

    def stage_parameters(self, stage: int) -> list[torch.nn.Parameter]:
        """Parameters of the components on ``stage`` (each once)."""
        seen, out = set(), []
        for n in self.stage_components(stage):
            for p in self.graph.by_name[n].parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def __repr__(self) -> str:
        body = ", ".join(f"{n}@{p.stage}.{p.lane}" for n, p in self.placement.items())
        return f"ComponentPlan({body}; devices={[str(d) for d in self.devices]})"
