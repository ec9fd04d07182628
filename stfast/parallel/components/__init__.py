"""Component parallelism (Lv et al., WASA 2021, second contribution): a model declares its forward as a
graph of components (:class:`ComponentGraph`; DeepTTE: ``DeepTTE.component_graph()``), a
:class:`ComponentPlan` places each component on a stage (device or rank) and a lane (CUDA stream or CPU
thread), and :class:`ComponentExecutor` runs it — concurrently where the graph allows, pipelined over
micro-batches across stages, with send/recv across processes — with the plain model's results.
:class:`ParallelLayout` arranges ranks as data-parallel replicas of component-parallel workers."""
from .executor import ComponentExecutor, StepResult, cat_rows, split_rows
from .graph import Component, ComponentGraph
from .layout import ParallelLayout
from .plan import ComponentPlan, Placement

__all__ = ["Component", "ComponentExecutor", "ComponentGraph", "ComponentPlan", "ParallelLayout", "Placement",
           "StepResult", "cat_rows", "split_rows"]
