"""``stfast.nn.LSTM``: drop-in for torch.nn.LSTM on the fused variable-length LSTM op (:mod:`stfast.ops.lstm`)."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from ..ops.lstm import lstm_packed, lstm_packed_sequence, lstm_padded


class LSTM(nn.Module):
    """Multi-layer unidirectional LSTM with torch.nn.LSTM's constructor, parameters and return types.

    Parameters (created in torch.nn.LSTM's order with its initialization U(−1/√H, 1/√H), so state dicts
    load both ways and the same seed gives the same weights): per layer k ``weight_ih_l{k}`` (4H, I_k),
    ``weight_hh_l{k}`` (4H, H) and, with ``bias``, ``bias_ih_l{k}``, ``bias_hh_l{k}`` (4H,); gates i, f, g, o.

    Inputs (B sequences, T steps, I = input_size, H = hidden_size, L = num_layers):
      - padded ``(T, B, I)`` (``(B, T, I)`` with ``batch_first``), or unbatched ``(T, I)``; optional
        ``lengths`` (B,) makes it variable-length (output zero past each length, h_n/c_n at each end);
      - ``PackedSequence`` (as torch.nn.LSTM; the result is a PackedSequence);
      - packed CSR through :meth:`forward_packed`.
    ``hx`` = (h0, c0), each ``(L, B, H)`` (``(L, H)`` unbatched). Returns ``output, (h_n, c_n)``.

    Not supported (ValueError / NotImplementedError): ``bidirectional``, ``proj_size`` (not in the
    constructor), and ``dropout > 0`` between layers while training (NotImplementedError naming it;
    in eval mode dropout has no effect, as in torch.nn.LSTM). dtypes: float32/float64 on the CPU, plus
    float16/bfloat16 on CUDA.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, device=None, dtype=None):
        super().__init__()
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError(f"hidden_size must be a positive int, got {hidden_size!r}")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
        if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout <= 1:
            raise ValueError(f"dropout must be a number in [0, 1], got {dropout!r}")
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

    def _check_dropout(self) -> None:
        if self.dropout > 0 and self.training and self.num_layers > 1:
            raise NotImplementedError(f"stfast.nn.LSTM: dropout={self.dropout} > 0 between layers is not implemented "
                                      "(use dropout=0.0, eval mode, or torch.nn.LSTM)")

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
        for padded input. Raises ValueError for bad lengths/shapes, NotImplementedError for training with
        dropout > 0 and num_layers > 1."""
        self._check_dropout()
        w = self.all_weights
        if isinstance(input, PackedSequence):
            if lengths is not None:
                raise ValueError("stfast.nn.LSTM: lengths is for padded input; a PackedSequence carries its own")
            h0, c0 = self._states(hx, True)
            if h0 is not None and input.sorted_indices is not None:
                h0, c0 = h0.index_select(1, input.sorted_indices), c0.index_select(1, input.sorted_indices)
            out, h_n, c_n = lstm_packed_sequence(input.data, input.batch_sizes, w, self.num_layers, h0, c0)
            if input.unsorted_indices is not None:
                h_n, c_n = h_n.index_select(1, input.unsorted_indices), c_n.index_select(1, input.unsorted_indices)
            return PackedSequence(out, input.batch_sizes, input.sorted_indices, input.unsorted_indices), (h_n, c_n)
        if input.dim() not in (2, 3):
            raise ValueError(f"stfast.nn.LSTM: input must be 2-D (unbatched) or 3-D, got shape {tuple(input.shape)}")
        batched = input.dim() == 3
        h0, c0 = self._states(hx, batched)
        x = input if batched else input.unsqueeze(1)
        batch_first = self.batch_first and batched
        out, h_n, c_n = lstm_padded(x, w, self.num_layers, lengths, h0, c0, batch_first)
        if not batched:
            return out.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        return out, (h_n, c_n)

    def forward_packed(self, input: Tensor, offsets: Tensor, hx: tuple[Tensor, Tensor] | None = None):
        """Packed (CSR) sequences: ``input`` (N, I), ``offsets`` (B + 1,) int64 (as the geo-conv op emits).
        Returns ``output`` (N, H) in the same rows and ``(h_n, c_n)`` (L, B, H) in sequence order."""
        self._check_dropout()
        h0, c0 = self._states(hx, True)
        out, h_n, c_n = lstm_packed(input, offsets, self.all_weights, self.num_layers, h0, c0)
        return out, (h_n, c_n)
