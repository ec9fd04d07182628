"""``ComponentExecutor``: runs a :class:`ComponentGraph` per a :class:`ComponentPlan` — forward, loss
and backward of one (global or per-rank) batch — with the same results as the plain forward.

How it works. Every component is cut from its neighbours: its produced inputs enter as detached leaves
(moved to its device), so it has a backward of its own: ``autograd.backward(outputs, grads)`` with the
gradients its consumers left in their leaves (summed in a fixed order: deterministic). The batch is split
into M micro-batches (rows); the tasks of one call are, in this global order,

    F(c, m) for m in 0..M−1 for c in topological order, each m followed by its loss L(m);
    B(c, m) for m in M−1..0 for c in reverse topological order

(GPipe's fill/drain: every forward first, then every backward). Each task runs on its component's lane
(stage, lane); a lane runs its tasks in that order. Because every task depends only on earlier tasks,
no schedule that keeps each lane's order can deadlock. The lanes are

- CPU, ``threads=False``: none — the calling thread runs every task in order (the sequential plan);
- CPU, ``threads=True``: one worker thread per lane; a task waits for the futures of the tasks it
  depends on (torch ops release the GIL, so lanes overlap; CPU stages of a pipeline overlap too);
- CUDA: one stream per lane, tasks launched in order from the calling thread; a task's stream waits on
  the events of its dependencies on other streams (``wait_event``), tensors made on one stream and used
  on another are ``record_stream``-ed so the caching allocator does not hand their memory out early,
  and each backward runs on its forward's stream (autograd replays every op on the stream its forward
  used). Values move between GPUs with ``.to(device, non_blocking=True)`` on the producer's stream,
  joined to the consumer's;
- across processes (``comm``): rank s of ``comm`` runs stage s's tasks in the global order; a value
  consumed on another stage is sent (``comm.send``, shape header first) right after its producer's
  forward and received there at the same position of the order, its gradient sent back right before the
  producer's backward. Sends are asynchronous, receives block: stage 0 computes micro-batch m+1 while
  stage 1 computes m.

Results equal the plain model's: the loss of each micro-batch must be its share of the batch loss (a
SUM divided by the whole batch's counts, as stfast's losses are), so the micro-batches' gradients add up
to the batch's. Dropout draws different masks per micro-batch / thread (equal in distribution only).
The caller's grad mode and ``torch.autocast`` (mixed precision) reach every task on every lane: forward
and loss tasks run under the caller's autocast, backward tasks outside it (as autocast asks).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from .plan import ComponentPlan

__all__ = ["ComponentExecutor", "StepResult", "cat_rows", "split_rows"]

LOSS = "<loss>"  # the loss / output task's name (not a component name: names may not contain '<')
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool]
_HEADER = 8  # dtype code, ndim, up to 6 dims


def split_rows(batch, n: int) -> list:
    """``batch`` (a tensor, a dict or dataclass of batch-major tensors) as min(n, B) contiguous row
    chunks of near-equal size (``torch.tensor_split`` sizes). Other dims (padded length L) are kept, so
    padding-sensitive code sees the same shapes. Raises ValueError when n < 1 or B = 0."""
    if n < 1:
        raise ValueError(f"micro_batches must be ≥ 1, got {n}")
    fields = _fields(batch)
    rows = {int(v.shape[0]) for v in fields.values()}
    if len(rows) != 1:
        raise ValueError(f"split_rows: all tensors must share dim 0 (B), got sizes {sorted(rows)}")
    b = rows.pop()
    if b == 0:
        raise ValueError("split_rows: the batch is empty")
    chunks = {k: torch.tensor_split(v, min(n, b)) for k, v in fields.items()}
    return [_rebuild(batch, {k: c[i] for k, c in chunks.items()}) for i in range(min(n, b))]


def cat_rows(parts: list):
    """Inverse of :func:`split_rows`: concatenates tensors (or the tensor fields of dicts/dataclasses)
    along dim 0."""
    if len(parts) == 1:
        return parts[0]
    keys = _fields(parts[0]).keys()
    return _rebuild(parts[0], {k: torch.cat([_fields(p)[k] for p in parts]) for k in keys})


def _fields(x) -> dict:
    if isinstance(x, torch.Tensor):
        return {None: x}
    if isinstance(x, Mapping):
        return dict(x)
    if dataclasses.is_dataclass(x):  # its tensor fields (DeepTTEOutput.members is None here: one model)
        return {f.name: getattr(x, f.name) for f in dataclasses.fields(x)
                if isinstance(getattr(x, f.name), torch.Tensor)}
    raise TypeError(f"expected a tensor, dict or dataclass of tensors, got {type(x).__name__}")


def _rebuild(like, fields: dict):
    if isinstance(like, torch.Tensor):
        return fields[None]
    if isinstance(like, Mapping):
        return fields
    return dataclasses.replace(like, **fields)


@dataclasses.dataclass
class StepResult:
    """``loss``: Σ of the micro-batches' losses (float; None on ranks not holding the loss stage or
    without a loss function); ``output``: the model output of the whole batch (rows in batch order,
    detached; None where the loss stage is on another rank)."""

    loss: float | None
    output: object


class ComponentExecutor:
    """Runs ``plan.graph`` per ``plan`` (see the module docstring).

    Args:
        plan: the placement; its graph is the model's (``model.component_graph()``).
        micro_batches: M ≥ 1 row chunks per call (pipelining across stages; 1 elsewhere is fastest).
        threads: CPU lanes as worker threads (one process, CPU devices only).
        comm: a :class:`~stfast.parallel.comm.Communicator` whose world size is the number of stages;
            this process runs stage ``comm.rank``. Every rank must call with the same batch.
        place_modules: move each component's modules to its stage's device (one process only).
        profile: record host seconds per task in :attr:`timings` (inline CPU execution).

    Raises ValueError on M < 1, threads with CUDA devices or with ``comm``, a communicator whose world
    size differs from the number of stages, or CUDA devices when torch sees none.
    """

    def __init__(self, plan: ComponentPlan, micro_batches: int = 1, threads: bool = False, comm=None,
                 place_modules: bool = True, profile: bool = False):
        if not isinstance(micro_batches, int) or micro_batches < 1:
            raise ValueError(f"micro_batches must be an int ≥ 1, got {micro_batches!r}")
        cuda = [d.type == "cuda" for d in plan.devices]
        if any(cuda) and not torch.cuda.is_available():
            raise ValueError(f"the plan uses CUDA devices {plan.devices} but torch sees no GPU")
        if threads and (any(cuda) or comm is not None):
            raise ValueError("threads=True is for one process on CPU devices (CUDA lanes are streams; across "
                             "processes each rank runs its stage in order)")
        if comm is not None and comm.world_size != plan.n_stages:
            raise ValueError(f"the communicator has world size {comm.world_size} but the plan has "
                             f"{plan.n_stages} stages (one rank per stage)")
        self.plan, self.graph = plan, plan.graph
        self.micro_batches, self.threads, self.comm, self.profile = micro_batches, threads, comm, profile
        self.stage = comm.rank if comm is not None else None
        self.timings: list[tuple[str, str, int, float]] = []  # (kind F/L/B, component, micro-batch, s)
        g = self.graph
        self.loss_stage = max([plan.stage_of(g.producer[o]) for o in g.outputs if o in g.producer], default=0)
        on_loss_stage = [n for n in g.order if plan.stage_of(n) == self.loss_stage]
        self.loss_lane = (self.loss_stage, plan.placement[on_loss_stage[-1]].lane if on_loss_stage else 0)
        self._pools: dict[tuple[int, int], ThreadPoolExecutor] = {}
        self._streams: dict[tuple[int, int], torch.cuda.Stream] = {}
        if comm is None and place_modules:
            for n in g.order:
                dev = plan.devices[plan.stage_of(n)]
                for mod in g.by_name[n].modules:
                    mod.to(dev)

    # ------------------------------------------------------------------ public
    def forward(self, batch) -> object:
        """The model output of ``batch`` (None on ranks without the loss stage)."""
        return self.run(batch).output

    def forward_backward(self, batch, loss_fn: Callable[[object, object], torch.Tensor]) -> StepResult:
        """Forward, ``loss_fn(output_m, micro_batch_m)`` per micro-batch (its share of the batch loss)
        and backward: parameter gradients ACCUMULATE into ``.grad`` (gradient accumulation and
        ``GradientSync`` work as with ``loss.backward()``)."""
        return self.run(batch, loss_fn)

    def run(self, batch, loss_fn=None) -> StepResult:
        grad = torch.is_grad_enabled() and loss_fn is not None
        micro = split_rows(batch, self.micro_batches)
        st = _State(self, micro, loss_fn, grad)
        tasks = st.tasks()
        if self.threads:
            self._run_threads(st, tasks)
        elif any(d.type == "cuda" for d in self.plan.devices):
            self._run_cuda(st, tasks)
        else:
            for t in tasks:
                st.run_task(t)
        st.finish()
        mine = self.comm is None or self.stage == self.loss_stage
        loss = float(sum(st.losses)) if (mine and loss_fn is not None) else None
        return StepResult(loss, cat_rows(st.outputs) if mine else None)

    def close(self) -> None:
        """Stop the worker threads (threads=True); the executor can still run (threads restart)."""
        for p in self._pools.values():
            p.shutdown(wait=True)
        self._pools.clear()

    # ------------------------------------------------------------------ lanes
    def _run_threads(self, st: _State, tasks: list) -> None:
        futures: dict[tuple, Future] = {}
        for t in tasks:
            lane = st.lane_of(t)
            if lane not in self._pools:
                self._pools[lane] = ThreadPoolExecutor(1, thread_name_prefix=f"stfast-lane{lane[0]}.{lane[1]}")
            deps = [futures[d] for d in st.deps(t)]
            futures[t] = self._pools[lane].submit(_after, deps, st.run_task, t)
        for f in futures.values():  # every task ends (a failed dependency fails its dependents): no hang
            f.exception()
        for t in tasks:
            futures[t].result()

    def _stream(self, lane: tuple[int, int]) -> torch.cuda.Stream:
        if lane not in self._streams:
            self._streams[lane] = torch.cuda.Stream(device=self.plan.devices[lane[0]])
        return self._streams[lane]

    def _run_cuda(self, st: _State, tasks: list) -> None:
        lanes = {st.lane_of(t) for t in tasks}
        streams = {lane: self._stream(lane) for lane in lanes}
        callers = {d: torch.cuda.current_stream(d) for d in {s.device for s in streams.values()}}
        for s in streams.values():  # the batch and parameters were written on the caller's streams
            s.wait_stream(callers[s.device])
        st.streams = streams
        events: dict[tuple, torch.cuda.Event] = {}
        for t in tasks:
            s = streams[st.lane_of(t)]
            for d in st.deps(t):
                if streams[st.lane_of(d)] is not s:
                    s.wait_event(events[d])
            with torch.cuda.stream(s):
                st.run_task(t)
                events[t] = torch.cuda.Event()
                events[t].record(s)
        for s in streams.values():  # the caller's next kernels see the outputs and .grad
            callers[s.device].wait_stream(s)
        for out in st.outputs:
            for v in _fields(out).values():
                if isinstance(v, torch.Tensor) and v.is_cuda:
                    v.record_stream(callers[v.device])


def _after(deps: list[Future], fn, task):
    for d in deps:
        d.result()
    return fn(task)


class _State:
    """The values, leaves and gradients of one call, and the execution of its tasks."""

    def __init__(self, ex: ComponentExecutor, micro: list, loss_fn, grad: bool):
        self.ex, self.g, self.plan = ex, ex.graph, ex.plan
        self.micro, self.loss_fn, self.grad = micro, loss_fn, grad
        self.M = len(micro)
        self.streams: dict | None = None
        self.vals = [dict(self.g.make_inputs(mb)) for mb in micro]  # every rank: sources are cheap
        missing = [s for s in self.g.sources if s not in self.vals[0]]
        if missing:
            raise ValueError(f"make_inputs did not return the declared sources {missing}")
        self.leaves: dict[tuple, dict[str, torch.Tensor]] = {}
        self.gin: list[dict[str, dict[str, torch.Tensor]]] = [{} for _ in micro]  # value → consumer → grad
        self.outputs: list = [None] * self.M
        self.losses: list = [0.0] * self.M
        self.works: list = []
        # the caller's autocast (device type, dtype) pairs: thread-local, so worker lanes take them up per task
        self.autocast = tuple((d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d))

    def _autocast(self, enabled: bool) -> contextlib.ExitStack:
        """The caller's autocast (``enabled``: forwards and losses), or autocast off on its devices (backwards)."""
        stack = contextlib.ExitStack()
        for device_type, dtype in self.autocast:
            stack.enter_context(torch.autocast(device_type, dtype=dtype, enabled=enabled))
        return stack

    # -------------------------------------------------------------- task list
    def tasks(self) -> list[tuple[str, str, int]]:
        order = self.g.order
        ts = []
        for m in range(self.M):
            ts += [("F", n, m) for n in order] + [("L", LOSS, m)]
        if self.grad:
            for m in reversed(range(self.M)):
                ts += [("B", n, m) for n in reversed(order)]
        if self.ex.comm is not None:  # this rank's tasks; transfers ride on the producers' positions
            return [t for t in ts if self.stage_of(t[1]) == self.ex.stage or self._transfers(t)]
        return ts

    def stage_of(self, name: str) -> int:
        return self.ex.loss_stage if name == LOSS else self.plan.stage_of(name)

    def lane_of(self, t) -> tuple[int, int]:
        if t[1] == LOSS:
            return self.ex.loss_lane
        p = self.plan.placement[t[1]]
        return (p.stage, p.lane)

    def _consumer_stages(self, value: str) -> list[int]:
        st = {self.plan.stage_of(c) for c in self.g.consumers(value)}
        if value in self.g.outputs:
            st.add(self.ex.loss_stage)
        return sorted(st)

    def _transfers(self, t) -> bool:
        """Does this rank take part in a transfer attached to task t?"""
        if t[0] == "L":
            return False
        c = self.g.by_name[t[1]]
        me = self.ex.stage
        return any(me in self._consumer_stages(o) for o in c.outputs)

    def deps(self, t) -> list[tuple]:
        kind, n, m = t
        g = self.g
        if kind == "F":
            return [("F", d, m) for d in g.dependencies(n)]
        if kind == "L":
            return list(dict.fromkeys(("F", g.producer[o], m) for o in g.outputs if o in g.producer))
        out = [("F", n, m)]
        for o in g.by_name[n].outputs:
            out += [("B", c, m) for c in g.consumers(o)]
            if o in g.outputs:
                out.append(("L", LOSS, m))
        return list(dict.fromkeys(out))

    # -------------------------------------------------------------- execution
    def run_task(self, t) -> None:
        kind, n, m = t
        t0 = time.perf_counter()
        with torch.set_grad_enabled(self.grad), self._autocast(kind != "B"):  # both are per thread
            mine = self.ex.comm is None or self.stage_of(n) == self.ex.stage
            if kind == "B" and self.ex.comm is not None:
                self._exchange_grads(n, m)
            if mine:
                (self._forward if kind == "F" else self._loss if kind == "L" else self._backward)(n, m)
            if kind == "F" and self.ex.comm is not None:
                self._exchange_values(n, m)
        if self.ex.profile:
            self.ex.timings.append((kind, n, m, time.perf_counter() - t0))

    def _device(self, name: str) -> torch.device:
        return self.plan.devices[self.stage_of(name)]

    def _stream_of(self, name: str):
        if self.streams is None:
            return None
        return self.streams[self.lane_of(("F", name, 0))]

    def _fetch(self, value: str, m: int, consumer: str) -> torch.Tensor:
        """``value`` of micro-batch m on the consumer's device; a produced value becomes a leaf whose
        gradient the producer's backward collects."""
        v = self.vals[m][value]
        if value in self.g.host_sources:  # read on the host by its consumers: moving it would cost a sync there
            return v
        dev = self._device(consumer)
        produced = value in self.g.producer
        if produced and self.streams is not None and v.is_cuda:
            src = self._stream_of(self.g.producer[value])
            if v.device != dev:  # copy on the producer's stream (its data is ready there), joined to ours
                with torch.cuda.stream(src):
                    v = v.to(dev, non_blocking=True)
            elif src is not self._stream_of(consumer):
                v.record_stream(self._stream_of(consumer))
        elif v.device != dev:
            v = v.to(dev, non_blocking=True)
        elif not produced and self.streams is not None and v.is_cuda:
            v.record_stream(self._stream_of(consumer))
        if produced and self.grad and v.is_floating_point():
            leaf = v.detach().requires_grad_()
            self.leaves.setdefault((consumer, m), {})[value] = leaf
            return leaf
        return v

    def _forward(self, n: str, m: int) -> None:
        c = self.g.by_name[n]
        outs = c(*[self._fetch(v, m, n) for v in c.inputs])
        for name, o in zip(c.outputs, outs):
            self.vals[m][name] = o

    def _loss(self, _n: str, m: int) -> None:
        values = {o: self._fetch(o, m, LOSS) for o in self.g.outputs}
        out = self.g.make_output(values)
        if self.loss_fn is not None:
            loss = self.loss_fn(out, self.micro[m])
            if self.grad:
                with self._autocast(False):
                    loss.backward()
                self._collect(LOSS, m)
            self.losses[m] = loss.detach()
        self.outputs[m] = _rebuild(out, {k: v.detach() if isinstance(v, torch.Tensor) else v
                                         for k, v in _fields(out).items()})

    def _collect(self, consumer: str, m: int) -> None:
        for value, leaf in self.leaves.pop((consumer, m), {}).items():
            if leaf.grad is not None:
                self.gin[m].setdefault(value, {})[consumer] = leaf.grad

    def _output_grad(self, value: str, m: int, dev: torch.device, stream) -> torch.Tensor | None:
        """Σ of the consumers' gradients of ``value`` (fixed order: deterministic), on ``dev``."""
        parts = self.gin[m].pop(value, {})
        total = None
        for k in sorted(parts):
            g = parts[k]
            if g.device != dev:
                on_lane = self.streams is not None and g.is_cuda and not k.startswith("<stage")
                with torch.cuda.stream(self._stream_of(k)) if on_lane else contextlib.nullcontext():
                    g = g.to(dev, non_blocking=True)
            elif stream is not None and g.is_cuda and not k.startswith("<stage") and self._stream_of(k) is not stream:
                g.record_stream(stream)  # made on the consumer's stream, read on the producer's
            total = g if total is None else total + g
        return total

    def _backward(self, n: str, m: int) -> None:
        c = self.g.by_name[n]
        dev, stream = self._device(n), self._stream_of(n)
        outs, grads = [], []
        for name in c.outputs:
            v = self.vals[m][name]
            g = self._output_grad(name, m, dev, stream)
            if g is not None and v.requires_grad:
                outs.append(v)
                grads.append(g)
        if outs:
            torch.autograd.backward(outs, grads)
        self._collect(n, m)

    # -------------------------------------------------------------- across processes
    def _exchange_values(self, n: str, m: int) -> None:
        """After F(n, m): the producer's rank sends each output to the stages that consume it; they
        receive it here (same position of the global order on every rank: the messages match)."""
        comm, me = self.ex.comm, self.ex.stage
        src = self.plan.stage_of(n)
        for o in self.g.by_name[n].outputs:
            dsts = [s for s in self._consumer_stages(o) if s != src]
            if me == src:
                v = self.vals[m][o].detach().contiguous()
                for d in dsts:
                    header = torch.zeros(_HEADER, dtype=torch.int64, device=v.device)
                    header[:2 + v.dim()] = torch.tensor([_DTYPES.index(v.dtype), v.dim(), *v.shape])
                    self.works += [comm.send(header, d), comm.send(v, d), header, v]
            elif me in dsts:
                dev = self.plan.devices[me]
                header = torch.empty(_HEADER, dtype=torch.int64, device=dev)
                comm.recv(header, src).wait()
                code, ndim, *dims = header.tolist()
                buf = torch.empty(dims[:ndim], dtype=_DTYPES[code], device=dev)
                comm.recv(buf, src).wait()
                self.vals[m][o] = buf

    def _exchange_grads(self, n: str, m: int) -> None:
        """Before B(n, m): each consuming stage sends Σ of its gradients of n's outputs (zeros when its
        consumers gave none) to the producer's rank, which adds them to its own consumers'."""
        if not self.grad:
            return
        comm, me = self.ex.comm, self.ex.stage
        src = self.plan.stage_of(n)
        for o in self.g.by_name[n].outputs:
            dsts = [s for s in self._consumer_stages(o) if s != src]
            if me in dsts:
                v = self.vals[m][o]
                g = self._output_grad(o, m, v.device, None)
                g = (torch.zeros_like(v) if g is None else g).contiguous()
                self.works += [comm.send(g, src), g]
            elif me == src:
                for d in dsts:
                    buf = torch.empty_like(self.vals[m][o])
                    comm.recv(buf, d).wait()
                    self.gin[m].setdefault(o, {})[f"<stage {d}>"] = buf

    def finish(self) -> None:
        for w in self.works:  # sends complete before their buffers may be freed
            if not isinstance(w, torch.Tensor):
                w.wait()
        self.works.clear()
