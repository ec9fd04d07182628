"""``stfast.nn.LSTM``: drop-in for torch.nn.LSTM on the fused variable-length LSTM op (:mod:`stfast.ops.lstm`)."""
from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from ..ops.lstm import lstm_packed, lstm_packed_sequence, lstm_padded


class LSTM(nn.Module):
    """Multi-layer unidirectional LSTM with torch.nn.LSTM's constructor, parameters and return types.

    Constructor: torch.nn.LSTM's arguments in its order (``input_size, hidden_size, num_layers=1, bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None``).
    Not supported, NotImplementedError naming the value: ``bidirectional=True`` and ``proj_size > 0``.
    ValueError (as torch.nn.LSTM): ``hidden_size`` / ``num_layers`` not positive ints, ``dropout`` outside
    [0, 1], ``proj_size`` < 0.

    Parameters (created in torch.nn.LSTM's order with its initialization U(−1/√H, 1/√H), so state dicts
    load both ways and the same seed gives the same weights): per layer k ``weight_ih_l{k}`` (4H, I_k),
    ``weight_hh_l{k}`` (4H, H) and, with ``bias``, ``bias_ih_l{k}``, ``bias_hh_l{k}`` (4H,); gates i, f, g, o.

    Inputs (B sequences, T steps, I = input_size, H = hidden_size, L = num_layers):
      - padded ``(T, B, I)`` (``(B, T, I)`` with ``batch_first``), or unbatched ``(T, I)``; optional
        ``lengths`` (B,) makes it variable-length (output zero past each length, h_n/c_n at each end);
      - ``PackedSequence`` (as torch.nn.LSTM; the result is a PackedSequence);
      - packed CSR through :meth:`forward_packed`.
    ``hx`` = (h0, c0), each ``(L, B, H)`` (``(L, H)`` unbatched). Returns ``output, (h_n, c_n)``.

    Dropout (Zaremba et al. 2014, torch.nn.LSTM's rule): with ``dropout`` = p > 0, in training mode, each
    layer's output but the last's is dropped out (``torch.nn.functional.dropout``) before the next layer
    reads it; the layers then run one fused call each (in eval mode, or with p = 0, one call for all).
    The masks are drawn in torch.nn.LSTM's CPU order (time-major (T, B, H), or the packed rows), so on the
    CPU the same seed gives torch.nn.LSTM's result. dtypes: float32/float64/float16/bfloat16 (the low
    precisions with float32 accumulation and cell state).
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None):
        super().__init__()
        if not isinstance(hidden_size, int) or isinstance(hidden_size, bool) or hidden_size <= 0:
            raise ValueError(f"hidden_size must be a positive int, got {hidden_size!r}")
        if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
        if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout <= 1:
            raise ValueError(f"dropout must be a number in [0, 1], got {dropout!r}")
        if not isinstance(proj_size, int) or isinstance(proj_size, bool) or proj_size < 0:
            raise ValueError(f"proj_size must be an int >= 0 (0: no projection), got {proj_size!r}")
        if bidirectional:
            raise NotImplementedError(f"stfast.nn.LSTM: bidirectional={bidirectional!r} is not supported "
                                      "(unidirectional only; use torch.nn.LSTM)")
        if proj_size > 0:
            raise NotImplementedError(f"stfast.nn.LSTM: proj_size={proj_size} > 0 (LSTM with projections) is not "
                                      "supported (use proj_size=0 or torch.nn.LSTM)")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"dropout={dropout} has no effect with num_layers=1: it applies between layers, not "
                          "after the last (as torch.nn.LSTM)", UserWarning, stacklevel=2)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = False, 0
        factory = {"device": device, "dtype": dtype}
        self._flat_weights_names = []
        for k in range(num_layers):
            in_k = input_size if k == 0 else hidden_size
            shapes = [(4 * hidden_size, in_k), (4 * hidden_size, hidden_size)]
            names = [f"weight_ih_l{k}", f"weight_hh_l{k}"]
            if bias:
                shapes += [(4 * hidden_size,), (4 * hidden_size,)]
                names += [f"bias_ih_l{k}", f"bias_hh_l{k}"]
            for name, shape in zip(names, shapes):
                setattr(self, name, nn.Parameter(torch.empty(shape, **factory)))
            self._flat_weights_names += names
        self.reset_parameters()

    def flatten_parameters(self) -> None:
        """No-op, for code written for torch.nn.LSTM (which packs its weights into one cuDNN buffer): the
        fused op reads the parameters where they are."""

    def reset_parameters(self) -> None:
        """U(−1/√H, 1/√H) for every parameter, in registration order (torch.nn.LSTM's initialization)."""
        stdv = 1.0 / math.sqrt(self.hidden_size)
        for w in self.parameters():
            nn.init.uniform_(w, -stdv, stdv)

    @property
    def all_weights(self) -> list[Tensor]:
        """Parameters in torch.nn.LSTM's flat order (per layer: weight_ih, weight_hh[, bias_ih, bias_hh])."""
        return [getattr(self, n) for n in self._flat_weights_names]

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        return s

    def _dropout_active(self) -> bool:
        return self.dropout > 0 and self.training and self.num_layers > 1

    def _stack(self, run, x: Tensor, h0: Tensor | None, c0: Tensor | None):
        """All layers through ``run(x, weights, num_layers, h0, c0) -> (out, h_n, c_n)``: one fused call, or,
        with dropout active, one call per layer with dropout on every output but the last layer's."""
        w = self.all_weights
        if not self._dropout_active():
            return run(x, w, self.num_layers, h0, c0)
        for name, s in (("h0", h0), ("c0", c0)):  # the op checks B and H; a layer slice must exist
            if s is not None and (s.dim() != 3 or s.shape[0] != self.num_layers):
                raise ValueError(f"stfast.lstm: {name} must be (num_layers, B, H) with num_layers={self.num_layers}, "
                                 f"got shape {tuple(s.shape)}")
        per = len(w) // self.num_layers
        h_n, c_n = [], []
        for k in range(self.num_layers):
            state = slice(k, k + 1)
            x, h, c = run(x, w[per * k: per * (k + 1)], 1, None if h0 is None else h0[state],
                          None if c0 is None else c0[state])
            h_n.append(h)
            c_n.append(c)
            if k < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        return x, torch.cat(h_n), torch.cat(c_n)

    def _check_input(self, input: Tensor) -> None:
        """torch.nn.LSTM's check of the input's feature dimension, before the op (whose own check would name
        the layer-0 weight that does not fit the input, not the input)."""
        if input.size(-1) != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {input.size(-1)}")

    @staticmethod
    def _states(hx, batched: bool):
        if hx is None:
            return None, None
        h0, c0 = hx
        if not batched:
            h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)
        return h0, c0

    def forward(self, input: Tensor | PackedSequence, hx: tuple[Tensor, Tensor] | None = None,
                lengths: Tensor | None = None):
        """torch.nn.LSTM's forward (padded, unbatched or PackedSequence input), plus optional ``lengths`` (B,)
        integer, for padded input. Raises, as torch.nn.LSTM does, RuntimeError when the input's last dimension
        is not ``input_size`` ("input.size(-1) must be equal to input_size. Expected I, got …") and ValueError
        when it is not 2-D or 3-D; ValueError for bad lengths or state shapes (see
        :func:`stfast.ops.lstm_padded`)."""
        if isinstance(input, PackedSequence):
            self._check_input(input.data)
            if lengths is not None:
                raise ValueError("stfast.nn.LSTM: lengths is for padded input; a PackedSequence carries its own")
            h0, c0 = self._states(hx, True)
            if h0 is not None and input.sorted_indices is not None:
                h0, c0 = h0.index_select(1, input.sorted_indices), c0.index_select(1, input.sorted_indices)
            out, h_n, c_n = self._stack(
                lambda x, w, L, h, c: lstm_packed_sequence(x, input.batch_sizes, w, L, h, c), input.data, h0, c0)
            if input.unsorted_indices is not None:
                h_n, c_n = h_n.index_select(1, input.unsorted_indices), c_n.index_select(1, input.unsorted_indices)
            return PackedSequence(out, input.batch_sizes, input.sorted_indices, input.unsorted_indices), (h_n, c_n)
        if input.dim() not in (2, 3):
            raise ValueError(f"LSTM: Expected input to be 2D or 3D, got {input.dim()}D instead (shape "
                             f"{tuple(input.shape)})")
        self._check_input(input)
        batched = input.dim() == 3
        h0, c0 = self._states(hx, batched)
        x = input if batched else input.unsqueeze(1)
        batch_first = self.batch_first and batched
        # Why time-major with dropout: torch.nn.LSTM drops out the (T, B, H) layer outputs; the same memory
        # order gives the same masks from the same seed.
        time_major = batch_first and self._dropout_active()
        if time_major:
            x, batch_first = x.transpose(0, 1), False
        out, h_n, c_n = self._stack(lambda x, w, L, h, c: lstm_padded(x, w, L, lengths, h, c, batch_first), x, h0, c0)
        if time_major:
            out = out.transpose(0, 1)
        if not batched:
            return out.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        return out, (h_n, c_n)

    def forward_packed(self, input: Tensor, offsets: Tensor, hx: tuple[Tensor, Tensor] | None = None):
        """Packed (CSR) sequences: ``input`` (N, I), ``offsets`` (B + 1,) int64 (as the geo-conv op emits).
        Returns ``output`` (N, H) in the same rows and ``(h_n, c_n)`` (L, B, H) in sequence order. Raises
        RuntimeError when ``input``'s last dimension is not ``input_size`` (as :meth:`forward`)."""
        self._check_input(input)
        h0, c0 = self._states(hx, True)
        out, h_n, c_n = self._stack(lambda x, w, L, h, c: lstm_packed(x, offsets, w, L, h, c), input, h0, c0)
        return out, (h_n, c_n)
