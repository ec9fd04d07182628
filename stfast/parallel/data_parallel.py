"""Data parallelism through torch.distributed: process-group set-up from the torchrun environment,
equal-count shards of each global batch, and an exact gradient all-reduce.

Exactness under unequal shards: every rank's loss is its shard's SUM divided by the GLOBAL batch's
count, so summing (not averaging) the ranks' gradients gives exactly the gradient of the global
batch's mean loss, whatever the shard sizes (an empty shard contributes zeros).
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


@dataclass
class DistInfo:
    """rank, world size and local rank of this process (0, 1, 0 when not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def init_from_env(device: str, timeout_s: float = 300.0) -> DistInfo:
    """Join the process group torchrun describes (env:// rendezvous: RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT). Gloo on CPU, NCCL on CUDA. Without torchrun's variables: one process."""
    if not launched_by_torchrun():
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))
    if info.world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(info.local_rank)
        try:
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **_restart_store(info, timeout_s))
        except dist.DistError as e:  # the store's timeout or a refused connection: name what did not meet
            first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
            raise JoinFailure(f"rank {info.rank} of world size {info.world_size} could not join the process group at "
                              f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} within --timeout-s "
                              f"{timeout_s:g}: the other ranks did not start, or MASTER_ADDR/MASTER_PORT differ "
                              f"between them ({type(e).__name__}: {first.strip()[:200]})") from None
    return info


class JoinFailure(RuntimeError):
    """A rank could not join the process group (torchrun's rendezvous): its peers never came."""


def _restart_store(info: DistInfo, timeout_s: float) -> dict:
    """After a torchrun restart (TORCHELASTIC_RESTART_COUNT > 0) with the agent's store, the keys the
    previous attempt's ranks published (their Gloo addresses) are still in that store and the new ranks
    would dial the dead ones; a prefix per attempt keeps the attempts apart. {} otherwise (env://)."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), info.world_size,
                          is_master=False, timeout=timedelta(seconds=timeout_s))
    return {"store": dist.PrefixStore(f"stfast/attempt_{attempt}", store), "rank": info.rank,
            "world_size": info.world_size}


def shutdown(wait_for_peers: bool = False) -> None:
    """Leave the process group, while the interpreter is fully alive. ``wait_for_peers`` (after a run every rank
    finished): first a barrier, so no rank tears its Gloo/NCCL state down while a peer is still working (rank 0
    writes the summary and plots after the last collective); an early-exiting rank was seen to abort (SIGABRT,
    "terminate called without an active exception") in that window. Skip it after an error: a peer may be gone.

    Everything of the run is released here, with the interpreter alive, not at its finalization: a rank that
    left the model, the gradient buckets and the communicator to the finalization aborted there after its files
    were written (1 in 21 two-rank runs; pytorch/pytorch#179291 describes how releasing collectives' state without
    the GIL aborts). Callers drop what they hold first: :func:`stfast.train.trainer.train` removes the gradient
    sync's hooks (they kept it, its buckets and the model alive in a cycle the garbage collector cannot see) and
    drops the trainer; the garbage is collected before the barrier and again after the groups are destroyed."""
    if dist.is_initialized():
        gc.collect()  # works and buckets dropped by the caller: released now, their group still up
        if wait_for_peers:
            dist.barrier()
        dist.destroy_process_group()
        gc.collect()  # the groups' last Python references (subgroups in cycles): their threads joined now


def equal_shard(global_batch: np.ndarray, info: DistInfo) -> np.ndarray:
    """This rank's trips of a global batch: every world_size-th trip starting at rank (counts differ
    by at most one; a rank may get none when the batch is smaller than the world)."""
    return global_batch[info.rank::info.world_size]


def all_reduce_gradients(params: list[torch.nn.Parameter], info: DistInfo,
                         extra: torch.Tensor | None = None) -> torch.Tensor | None:
    """Sum the gradients of ``params`` over all ranks, in one flat buffer. Parameters without a
    gradient on this rank (for example an empty shard) take part as zeros. ``extra`` (a small 1-D
    float tensor, e.g. gradient-noise statistics) is summed in the same all-reduce and returned (in
    the gradients' dtype); None when not given."""
    if not info.distributed:
        return extra
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    tail = [] if extra is None else [extra.to(grads[0].dtype)]
    flat = _flatten_dense_tensors(grads + tail)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    reduced = _unflatten_dense_tensors(flat, grads + tail)
    for g, r in zip(grads, reduced):
        g.copy_(r)
    return reduced[-1] if tail else None


def all_reduce_sum(values: np.ndarray, info: DistInfo) -> np.ndarray:
    """Sum a small float64 vector over ranks (metrics sums, loss totals)."""
    if not info.distributed:
        return values
    t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.numpy()


def _small_tensor(values: np.ndarray) -> torch.Tensor:
    """float64 tensor of ``values`` on the device the process group's backend needs (NCCL: CUDA)."""
    t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))
    return t.cuda() if dist.get_backend() == "nccl" else t


def all_gather_floats(values: np.ndarray, info: DistInfo) -> np.ndarray:
    """Every rank's float64 vector ``values`` [k] (same k on all ranks) as an array [W, k], rank order
    (one process: values[None])."""
    values = np.asarray(values, dtype=np.float64)
    if not info.distributed:
        return values[None].copy()
    t = _small_tensor(values)
    out = [torch.empty_like(t) for _ in range(info.world_size)]
    dist.all_gather(out, t)
    return torch.stack(out).cpu().numpy()


def broadcast_floats(values: np.ndarray, info: DistInfo, src: int = 0) -> np.ndarray:
    """Rank ``src``'s float64 vector ``values`` on every rank."""
    if not info.distributed:
        return np.asarray(values, dtype=np.float64)
    t = _small_tensor(values)
    dist.broadcast(t, src)
    return t.cpu().numpy()


def _child_pids() -> list[int]:
    """PIDs of this process's children (Linux /proc): the ranks torchrun's agent started."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except (OSError, ValueError):
            pass
    return pids


def launch(nproc: int, argv: list[str]) -> int:
    """Start ``python -m stfast.cli argv`` on ``nproc`` local processes exactly as torchrun does
    (standalone rendezvous). Returns the exit code: 0 when every rank exited 0 and no SIGINT came, 130
    (128 + SIGINT) when the ranks stopped cleanly on one, 1 when a rank failed.

    SIGINT (Ctrl-C): torchrun's agent starts each rank in a session of its own, so the signal reaches
    this launcher only. It is passed on to the ranks once, and each stops cleanly after its current
    step (writing last.pt); the launcher waits for them and reports their exit status (torchrun's agent
    would report the signal as a failure, exit 1). A second SIGINT, a second or more later, is passed on
    too: the ranks then stop at once (one arriving within 1 s is taken for the same Ctrl-C delivered twice)."""
    import signal

    from torch.distributed.run import get_args_parser, run

    parser = get_args_parser()
    flags = ["--standalone", "--nproc-per-node", str(nproc)]
    if any("--signals-to-handle" in a.option_strings for a in parser._actions):
        # the signals torchrun's agent handles itself (it signals the ranks and fails): all but SIGINT
        flags += ["--signals-to-handle", "SIGTERM,SIGHUP,SIGQUIT"]
    # our own flags are attached after parsing: argparse would otherwise match them against torchrun's
    args = parser.parse_args([*flags, "--module", "stfast.cli"])
    args.training_script_args = list(argv)
    # `python -m` would put the working directory first on sys.path, so run from a source checkout the
    # workers would import its uncompiled stfast/ instead of the installed package (Python ≥ 3.11)
    os.environ.setdefault("PYTHONSAFEPATH", "1")

    last = [-math.inf]

    def forward(signum, frame):
        # one Ctrl-C can arrive twice within microseconds (e.g. `timeout` signals its child and then its
        # process group): passed on twice it would stop the ranks at once, so a repeat within 1 s is dropped
        now = time.monotonic()
        if now - last[0] < 1.0:
            return
        last[0] = now
        for pid in _child_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    previous = signal.signal(signal.SIGINT, forward)
    try:
        run(args)
    except Exception as e:  # torchrun raises ChildFailedError with the failing rank's traceback
        print(f"stfast: distributed run failed: {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, previous)
    return 128 + signal.SIGINT if last[0] > -math.inf else 0  # stopped by Ctrl-C: not finished
