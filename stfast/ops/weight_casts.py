"""Each weight cast to bfloat16 once per optimizer step under autocast, not once per forward pass.

Under ``torch.autocast`` every op of the "lower precision" policy (``aten::linear``, ``aten::conv1d``, the RNN
ops, stfast's fused LSTM and geo-conv: :mod:`stfast.ops.autocast`) casts the float32 weights it reads to the
autocast dtype. torch keeps those casts only until the outermost autocast block exits, and a training loop
enters one per forward pass: with k micro-batches per optimizer step (gradient accumulation) every weight is cast
k times per step, an evaluation casts it once per batch, though the weights change only at the optimizer step.

Inside a :class:`KeptCasts` block each weight's cast is made once and every forward pass of the block uses it,
until the weight changes or the block ends:

- the ops torch's autocast casts for keep torch's own cast cache: the block holds an autocast level open
  (``torch.autocast(device, enabled=False)``; torch drops its cache when the outermost autocast block exits,
  so the per-forward blocks inside no longer drop it);
- stfast's fused ops take their casts from the block (:func:`cast`).

Never a stale cast: :meth:`KeptCasts.check`, run before each forward pass (``stfast.train.precision.autocast``
does), drops every kept cast when any weight changed since the last one: its version counter (any in-place
update: an optimizer step, ``load_state_dict``, ``copy_``, an average's update), its storage (``p.data = ...``) or the
grad mode (a cast made under ``no_grad`` has no autograd node). :func:`cast` also keys each of its casts on
these. (In-place changes through ``p.data`` are invisible to autograd's version counter, here as in autograd.)

Bitwise the same results as a cast per forward pass: a kept cast holds the same bits (round to nearest even of
the same float32 numbers) and its autograd node is the cast's (backward: the gradient cast to float32), reached
by each forward's backward in turn, so the float32 weights get the same gradients in the same order.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

_BLOCKS: list["KeptCasts"] = []  # the blocks entered, innermost last; process-wide: a forward's worker threads see them


class KeptCasts:
    """A block of forward passes under autocast to ``dtype`` on ``device_type`` (``"cpu"``, ``"cuda"``) that
    share their weights' casts. ``weights``: every leaf tensor that requires grad the forward passes read (a
    model's parameters); they are checked for changes by :meth:`check`. Enter it outside autocast, around the
    forward (and backward) passes of one optimizer step, or of an evaluation. ``made``: the casts this block
    made for stfast's fused ops (torch's own are counted by a profiler, as ``aten::_to_copy``)."""

    def __init__(self, device_type: str, weights: Iterable[Tensor], dtype: torch.dtype = torch.bfloat16):
        self.device_type, self.dtype = device_type, dtype
        self.weights = list(weights)
        self.made = 0
        self._casts: dict[int, tuple[Tensor, tuple, Tensor]] = {}  # id(weight) → (weight, its state, its cast)
        self._state = None
        self._level = None

    def _now(self) -> tuple:
        return torch.is_grad_enabled(), [(w._version, w.data_ptr()) for w in self.weights]

    def __enter__(self) -> "KeptCasts":
        # an autocast level open for the block: the per-forward autocast blocks inside exit to it, not to level 0
        self._level = torch.autocast(self.device_type, dtype=self.dtype, enabled=False)
        self._level.__enter__()
        self._state = self._now()
        _BLOCKS.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _BLOCKS.remove(self)
        self._drop()  # also when entered inside another autocast block: no cast outlives the block
        self._level.__exit__(*exc)

    def _drop(self) -> None:
        self._casts.clear()
        torch.clear_autocast_cache()

    def check(self) -> None:
        """Drop every kept cast if a weight changed (version, storage) or the grad mode did since the last
        check; call it before each forward pass of the block."""
        now = self._now()
        if now != self._state:
            self._state = now
            self._drop()

    def cast(self, t: Tensor, dtype: torch.dtype) -> Tensor:
        """``t`` cast to ``dtype`` (a tensor with autograd history to ``t``): the kept cast of a weight (a float32
        leaf that requires grad, not a view: the weights torch's autocast caches) when it is unchanged; any
        other tensor is cast anew."""
        if dtype != self.dtype or t.dtype != torch.float32 or not (t.is_leaf and t.requires_grad) or t._is_view():
            return t.to(dtype)
        state = (t._version, t.data_ptr(), torch.is_grad_enabled())
        kept = self._casts.get(id(t))
        if kept is not None and kept[0] is t and kept[1] == state:
            return kept[2]
        out = t.to(dtype)
        self._casts[id(t)] = (t, state, out)  # t held: its id names no other tensor while the block lasts
        self.made += 1
        return out


def active() -> KeptCasts | None:
    """The innermost :class:`KeptCasts` block entered (None: none)."""
    return _BLOCKS[-1] if _BLOCKS else None


def cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` cast to ``dtype`` (``t.to(dtype)``, with autograd history), the kept cast inside a
    :class:`KeptCasts` block (see :meth:`KeptCasts.cast`)."""
    block = active()
    return t.to(dtype) if block is None else block.cast(t, dtype)
