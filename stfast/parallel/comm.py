"""Communicators and bucketed, overlapped gradient synchronization for data parallelism.

- :class:`Communicator`: the protocol the trainer (and :class:`GradientSync`) uses: all_reduce, broadcast,
  all_gather, reduce_scatter, send/recv, grouped calls; asynchronous calls return a :class:`Work`.
- :class:`TorchCommunicator` (default): torch.distributed's process group (Gloo on CPU, NCCL on GPU).
- :class:`NcclCommunicator` (opt-in, ``stfast train --comm nccl``): stfast's C++ NCCL communicator
  (csrc/comm/), bootstrapped through the same torch.distributed Store; CUDA tensors only.
- :class:`GradientSync`: DDP-style flat buckets whose all-reduce starts from a post-accumulate-grad hook
  as soon as all of a bucket's gradients are ready, overlapping the rest of the backward.

Semantics: gradients are SUMMED over ranks, never averaged. Every rank's loss is its shard's sum divided
by the GLOBAL batch's count (stfast.parallel.data_parallel), so the sum is exactly the gradient of the
global batch's mean loss, whatever the shard sizes.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist

__all__ = [
    "REDUCE_OPS",
    "Bucket",
    "Communicator",
    "GradientSync",
    "NcclCommunicator",
    "TorchCommunicator",
    "Work",
    "assign_buckets",
    "make_communicator",
    "native_group",
    "nccl_available",
]

REDUCE_OPS = ("sum", "avg")
DEFAULT_BUCKET_CAP_MB = 25.0  # as torch DDP
DEFAULT_FIRST_BUCKET_MB = 1.0  # as torch DDP (dist._DEFAULT_FIRST_BUCKET_BYTES): the first all-reduce starts early


@runtime_checkable
class Work(Protocol):
    """Handle of an asynchronous operation. ``wait()``: the result is ready for the caller's next
    operations (CPU: the host waited; CUDA: the caller's current stream waits, no host sync)."""

    def wait(self) -> object: ...


@runtime_checkable
class Communicator(Protocol):
    """What data parallelism needs from a communicator. Tensors are contiguous and on the communicator's
    device; ``op`` is ``"sum"`` or ``"avg"``; ``async_op=True`` returns a :class:`Work`, otherwise the
    call returns None once the result is ready for the caller's next operations."""

    rank: int
    world_size: int

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False) -> Work | None: ...

    def broadcast(self, tensor: torch.Tensor, root: int, async_op: bool = False) -> Work | None: ...

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> Work | None: ...

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum",
                       async_op: bool = False) -> Work | None: ...

    def send(self, tensor: torch.Tensor, peer: int) -> Work: ...

    def recv(self, tensor: torch.Tensor, peer: int) -> Work: ...

    def group(self) -> contextlib.AbstractContextManager: ...


# torch >= 2.13 names them *_single (the *_tensor names are deprecated there)
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _check_op(op: str) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")


def _check_peer(peer: int, world_size: int, name: str = "peer") -> None:
    if not 0 <= peer < world_size:
        raise ValueError(f"{name} must be in [0, {world_size}), got {peer}")


class _Deferred:
    """Work of a send/recv queued inside :meth:`TorchCommunicator.group`: done when its batch is."""

    def __init__(self):
        self.works: list = []

    def wait(self):
        for w in self.works:
            w.wait()
        return True


class TorchCommunicator:
    """:class:`Communicator` over a torch.distributed process group (default: the default group; Gloo on
    CPU, NCCL on GPU). ``avg`` on backends without ReduceOp.AVG (Gloo) divides by the world size first
    and sums. Inside :meth:`group`, send/recv are batched (``dist.batch_isend_irecv`` at the end of the
    block); collectives run as called. Raises RuntimeError when torch.distributed is not initialized."""

    def __init__(self, group: dist.ProcessGroup | None = None):
        if not dist.is_initialized():
            raise RuntimeError("TorchCommunicator needs torch.distributed to be initialized "
                               "(dist.init_process_group, or stfast train --nproc N / torchrun)")
        self.process_group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        self._pending: list[tuple[dist.P2POp, _Deferred]] | None = None

    def _reduce_op(self, tensor: torch.Tensor, op: str):
        _check_op(op)
        if op == "sum":
            return dist.ReduceOp.SUM
        if self.backend == "nccl":
            return dist.ReduceOp.AVG
        tensor.div_(self.world_size)
        return dist.ReduceOp.SUM

    def all_reduce(self, tensor, op="sum", async_op=False):
        return dist.all_reduce(tensor, op=self._reduce_op(tensor, op), group=self.process_group, async_op=async_op)

    def broadcast(self, tensor, root, async_op=False):
        _check_peer(root, self.world_size, "root")
        return dist.broadcast(tensor, src=dist.get_global_rank(self.process_group, root) if self.process_group else root,
                              group=self.process_group, async_op=async_op)

    def all_gather(self, output, input, async_op=False):
        if output.numel() != input.numel() * self.world_size:
            raise ValueError(f"all_gather: output must hold world_size * input.numel() = "
                             f"{input.numel() * self.world_size} elements, got {output.numel()}")
        return _all_gather_single(output, input, group=self.process_group, async_op=async_op)

    def reduce_scatter(self, output, input, op="sum", async_op=False):
        if input.numel() != output.numel() * self.world_size:
            raise ValueError(f"reduce_scatter: input must hold world_size * output.numel() = "
                             f"{output.numel() * self.world_size} elements, got {input.numel()}")
        return _reduce_scatter_single(output, input, op=self._reduce_op(input, op), group=self.process_group,
                                          async_op=async_op)

    def _p2p(self, fn, tensor, peer):
        _check_peer(peer, self.world_size)
        gpeer = dist.get_global_rank(self.process_group, peer) if self.process_group else peer
        if self._pending is None:
            return (dist.isend if fn == "send" else dist.irecv)(tensor, gpeer, group=self.process_group)
        handle = _Deferred()
        self._pending.append((dist.P2POp(dist.isend if fn == "send" else dist.irecv, tensor, gpeer,
                                         group=self.process_group), handle))
        return handle

    def send(self, tensor, peer):
        return self._p2p("send", tensor, peer)

    def recv(self, tensor, peer):
        return self._p2p("recv", tensor, peer)

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Batch the send/recv of the block (posted together at its end, so two ranks may both send
        first without deadlock)."""
        outer = self._pending is not None
        if not outer:
            self._pending = []
        try:
            yield
        finally:
            if not outer:
                pending, self._pending = self._pending, None
                if pending:
                    works = dist.batch_isend_irecv([p for p, _ in pending])
                    for (_, handle), w in zip(pending, works):
                        handle.works.append(w)


def nccl_available() -> bool:
    """True when stfast was built with the NCCL communicator (CUDA + NCCL at build time)."""
    from .. import build_info

    return bool(build_info()["nccl"])


_NCCL_KEYS = itertools.count()


class NcclCommunicator:
    """:class:`Communicator` over stfast's C++ NCCL communicator (csrc/comm/nccl_communicator.h).

    Rank 0 creates the ncclUniqueId and publishes it in ``store`` under ``key``; the others wait for it
    up to ``timeout_s`` (the error names rank and key). Collectives run on the communicator's own CUDA
    stream, joined to the caller's current stream by events; a watchdog aborts the communicator on an
    asynchronous NCCL error or an operation older than ``timeout_s``, so a failed rank does not hang
    the others. Defaults: the default process group's store, rank and world size, device
    ``torch.cuda.current_device()``, and a key numbered per process (ranks must create their
    communicators in the same order).

    Tensors: contiguous, on ``device``; float32/64, float16, bfloat16 (``sum`` also int32/int64).
    Raises RuntimeError when stfast was built without NCCL or no CUDA device is visible, ValueError on
    bad ranks, devices or timeouts, RuntimeError on NCCL errors and timeouts.
    """

    def __init__(self, store: dist.Store | None = None, rank: int | None = None, world_size: int | None = None,
                 device: int | torch.device | None = None, timeout_s: float = 300.0, key: str | None = None):
        if not nccl_available():
            raise RuntimeError("stfast was built without the NCCL communicator (it needs a CUDA build of torch, "
                               "nvcc and NCCL at build time: STFAST_CUDA=1 pip install --no-build-isolation -e .); "
                               "use the torch.distributed communicator (--comm torch)")
        if not torch.cuda.is_available():
            raise RuntimeError("NcclCommunicator needs a CUDA device; torch sees none (use --comm torch)")
        if store is None:
            if not dist.is_initialized():
                raise RuntimeError("NcclCommunicator: pass store, rank and world_size, or initialize "
                                   "torch.distributed first")
            store = dist.distributed_c10d._get_default_store()
        rank = dist.get_rank() if rank is None else int(rank)
        world_size = dist.get_world_size() if world_size is None else int(world_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if device is None:
            device = torch.cuda.current_device()
        index = device.index if isinstance(device, torch.device) else int(device)
        if isinstance(device, torch.device) and (device.type != "cuda" or index is None):
            raise ValueError(f"device must be a CUDA device with an index, got {device}")
        if not 0 <= index < torch.cuda.device_count():
            raise ValueError(f"device must be in [0, {torch.cuda.device_count()}), got {index}")
        from .. import _C

        self.key = key if key is not None else f"stfast_nccl_unique_id/{next(_NCCL_KEYS)}"
        self._c = _C.NcclCommunicator(store, rank, world_size, index, float(timeout_s), self.key)
        self.rank, self.world_size, self.device = rank, world_size, torch.device("cuda", index)

    @staticmethod
    def nccl_version() -> tuple[int, int, int]:
        """(major, minor, patch) of the NCCL library stfast links."""
        from .. import _C

        v = _C.NcclCommunicator.nccl_version()
        return (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100)

    @property
    def error(self) -> str:
        """The communicator's error ("" while healthy)."""
        return self._c.error

    @staticmethod
    def _done(work, async_op: bool):
        if async_op:
            return work
        work.wait()
        return None

    def all_reduce(self, tensor, op="sum", async_op=False):
        _check_op(op)
        return self._done(self._c.all_reduce(tensor, op), async_op)

    def broadcast(self, tensor, root, async_op=False):
        _check_peer(root, self.world_size, "root")
        return self._done(self._c.broadcast(tensor, root), async_op)

    def all_gather(self, output, input, async_op=False):
        return self._done(self._c.all_gather(output, input), async_op)

    def reduce_scatter(self, output, input, op="sum", async_op=False):
        _check_op(op)
        return self._done(self._c.reduce_scatter(output, input, op), async_op)

    def send(self, tensor, peer):
        _check_peer(peer, self.world_size)
        return self._c.send(tensor, peer)

    def recv(self, tensor, peer):
        _check_peer(peer, self.world_size)
        return self._c.recv(tensor, peer)

    def group(self) -> contextlib.AbstractContextManager:
        """ncclGroupStart/End around the block: its operations launch together at the end (wait on their
        Works after the block). See :func:`native_group`."""
        return native_group(self._c)

    def abort(self, reason: str = "aborted by the caller") -> None:
        """ncclCommAbort; later calls raise ``reason``. Inside a group holding operations on this
        communicator the error is recorded at once and the abort runs when the group ends."""
        self._c.abort(reason)

    def close(self) -> None:
        """Finish the operations in flight and free the communicator (raises on error or timeout, and
        inside a group holding operations on it). Works that finished keep answering ``wait()`` /
        ``is_completed()`` afterwards."""
        self._c.close()


@contextlib.contextmanager
def native_group(c) -> Iterator[None]:
    """NCCL group around the block for a native communicator ``c`` (``stfast._C.NcclCommunicator``, or the
    test hook ``stfast._C._FakeComm``): ``c.group_start()``, then ``c.group_end()`` however the block ends.

    NCCL groups are per thread: every operation the thread issues in the block, on any communicator,
    launches at the end. ``group_end`` always closes the thread's NCCL group before it raises; it raises
    RuntimeError when the group's operations were cancelled (an NCCL error inside the group, or an abort
    requested meanwhile: that communicator is then aborted). When the block itself raises, the group is
    still ended (its queued operations launch) and the block's exception propagates, with a note when
    ending the group failed too."""
    c.group_start()
    try:
        yield
    except BaseException as e:
        try:
            c.group_end()
        except RuntimeError as end_error:
            e.add_note(f"and ending the NCCL group raised: {end_error}")
        raise
    c.group_end()


def make_communicator(kind: str, device: torch.device | str = "cpu", timeout_s: float = 300.0) -> Communicator:
    """The communicator ``stfast train --comm`` names: ``"torch"`` (torch.distributed's default group) or
    ``"nccl"`` (stfast's C++ communicator on ``device``, bootstrapped through the default group's store).
    Raises ValueError on another kind, RuntimeError when it cannot be built here."""
    if kind == "torch":
        return TorchCommunicator()
    if kind == "nccl":
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"--comm nccl needs a CUDA device, got {device}")
        return NcclCommunicator(device=device.index if device.index is not None else torch.cuda.current_device(),
                                timeout_s=timeout_s)
    raise ValueError(f"communicator must be 'torch' or 'nccl', got {kind!r}")


# ---------------------------------------------------------------------------------------------- buckets
@dataclass
class Bucket:
    """Parameters whose gradients are all-reduced together, in one flat buffer of one dtype and device.
    ``index`` positions of the parameters (registration order); ``numel`` their element counts."""

    index: list[int]
    numel: list[int]
    dtype: torch.dtype
    device: torch.device
    itemsize: int
    buffer: torch.Tensor | None = None
    pending: int = 0  # gradients not ready yet in this step
    work: object = None
    launched: bool = False
    views: list[torch.Tensor] = field(default_factory=list)  # per parameter, into buffer
    flags: torch.Tensor | None = None  # per parameter: 1 where this rank has a gradient (summed: ranks with one)
    missing: bool = False  # this rank lacked a gradient of the bucket in this step

    @property
    def nbytes(self) -> int:
        return sum(self.numel) * self.itemsize


def assign_buckets(params: list[torch.Tensor], cap_bytes: int, first_cap_bytes: int) -> list[Bucket]:
    """DDP's bucket assignment: parameters in REVERSE registration order (gradients become ready roughly
    from the last layer back), one dtype and device per bucket; a bucket is closed when the next parameter
    would take it over its cap: ``first_cap_bytes`` for the first bucket of each (dtype, device),
    ``cap_bytes`` after (a parameter larger than the cap gets a bucket of its own). Buckets are returned
    in the order they are filled, which is the order they are all-reduced in. Raises ValueError on caps ≤ 0."""
    if cap_bytes <= 0 or first_cap_bytes <= 0:
        raise ValueError(f"bucket caps must be > 0 bytes, got cap {cap_bytes}, first {first_cap_bytes}")
    buckets: list[Bucket] = []
    open_: dict[tuple, Bucket] = {}  # the bucket being filled per (dtype, device)
    count: dict[tuple, int] = {}  # buckets made per (dtype, device)
    for i in reversed(range(len(params))):
        p = params[i]
        key = (p.dtype, p.device)
        b = open_.get(key)
        if b is not None:
            cap = first_cap_bytes if count[key] == 1 else cap_bytes
            if b.nbytes + p.numel() * p.element_size() > cap:
                b = None
        if b is None:
            b = Bucket([], [], p.dtype, p.device, p.element_size())
            buckets.append(b)
            open_[key] = b
            count[key] = count.get(key, 0) + 1
        b.index.append(i)
        b.numel.append(p.numel())
    return buckets


class GradientSync:
    """Sums gradients over the ranks of ``comm`` in flat buckets, overlapped with the backward.

    Each parameter gets a post-accumulate-grad hook; when all gradients of a bucket are ready, the bucket
    is copied into its flat buffer and its all-reduce (SUM) starts asynchronously; buckets start in their
    fixed order on every rank (a ready bucket waits for the earlier ones), so the collectives match across
    ranks. :meth:`finish` (before the optimizer step) starts the buckets not started yet (parameters
    without a gradient on this rank, e.g. an empty shard, take part as zeros), waits for all and copies
    the sums back into ``p.grad``. Inside :meth:`no_sync` the hooks do nothing: gradients accumulate
    locally (micro-steps 1..k−1 of gradient accumulation) and the next synced backward sums the total.

    Buckets: ``bucket_cap_mb`` (25 MB, as DDP), the first one ``first_bucket_mb`` (1 MB) so that the
    first all-reduce starts early; parameters in reverse registration order. Either communicator plugs in.

    Raises ValueError on caps ≤ 0 or a parameter list without trainable parameters.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], comm: Communicator,
                 bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB, first_bucket_mb: float = DEFAULT_FIRST_BUCKET_MB):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("GradientSync: no parameters that require a gradient")
        self.comm = comm
        self.buckets = assign_buckets(self.params, int(bucket_cap_mb * 2**20), int(first_bucket_mb * 2**20))
        self._bucket_of = {}
        for bi, b in enumerate(self.buckets):
            for i in b.index:
                self._bucket_of[i] = bi
        self._enabled = True
        self._next = 0  # next bucket to launch (launch order = bucket order)
        self._ready: set[int] = set()  # parameter indices whose gradient is ready this step
        self._lock = threading.Lock()  # hooks may run on autograd's device threads
        self._reset()
        self._handles = [p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(self.params)]

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside the block accumulate gradients locally without communication."""
        prev, self._enabled = self._enabled, False
        try:
            yield
        finally:
            self._enabled = prev

    def _hook(self, i: int):
        def hook(p: torch.Tensor) -> None:
            if not self._enabled:
                return
            with self._lock:
                if i in self._ready:  # its bucket may be on the wire already: this gradient would be lost
                    raise RuntimeError(f"GradientSync: the gradient of parameter {i} became ready twice in one "
                                       "synchronized step; run the earlier backward passes inside no_sync()")
                self._ready.add(i)
                b = self.buckets[self._bucket_of[i]]
                b.pending -= 1
                self._launch_ready()
        return hook

    def _reset(self) -> None:
        for b in self.buckets:
            b.pending, b.work, b.launched = len(b.index), None, False
        self._next = 0
        self._ready.clear()

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self._launch(self.buckets[self._next])
            self._next += 1

    def _launch(self, b: Bucket) -> None:
        n = len(b.index)
        if b.buffer is None:
            # gradients, then one "has a gradient" flag per parameter: after the sum, a parameter keeps
            # grad None only when no rank produced a gradient for it (as in one process)
            b.buffer = torch.empty(sum(b.numel) + n, dtype=b.dtype, device=b.device)
            parts = b.buffer.split(b.numel + [n])
            b.views = [v.view_as(self.params[i]) for v, i in zip(parts, b.index)]
            b.flags = parts[-1]
        grads = [self.params[i].grad for i in b.index]
        b.missing = any(g is None for g in grads)
        for v, g in zip(b.views, grads):
            if g is None:
                v.zero_()
            else:
                v.copy_(g)
        if b.missing:
            b.flags.copy_(torch.tensor([g is not None for g in grads], dtype=b.dtype))
        else:
            b.flags.fill_(1)
        b.work = self.comm.all_reduce(b.buffer, "sum", async_op=True)
        b.launched = True

    def finish(self, extra: torch.Tensor | None = None) -> torch.Tensor | None:
        """Start the buckets not started yet, wait for every bucket and write the sums into ``p.grad``.
        A parameter without a gradient on this rank gets the sum when another rank had one, and stays
        None when no rank had one. Call once per optimizer step, after the last backward pass.

        ``extra``: an optional small 1-D tensor (for example gradient-noise statistics [S], float64) summed
        over the ranks after the buckets, in the same wait; returned summed, on its own device and dtype
        (None when not given)."""
        with self._lock:
            for b in self.buckets[self._next:]:
                b.pending = 0
            self._launch_ready()
            summed, extra_work = None, None
            if extra is not None:
                summed = extra.to(self.buckets[0].device, copy=True)
                extra_work = self.comm.all_reduce(summed, "sum", async_op=True)
            for b in self.buckets:
                b.work.wait()
                # reading the flags syncs with the device: only where this rank lacked a gradient
                present = b.flags.tolist() if b.missing else None
                for j, (v, i) in enumerate(zip(b.views, b.index)):
                    p = self.params[i]
                    if p.grad is not None:
                        p.grad.copy_(v)
                    elif present[j] > 0:
                        p.grad = v.clone()
            if extra_work is not None:
                extra_work.wait()
            self._reset()
        return None if summed is None else summed.to(extra.device)

    def remove(self) -> None:
        """Remove the hooks (the parameters no longer trigger communication)."""
        for h in self._handles:
            h.remove()
        self._handles = []
