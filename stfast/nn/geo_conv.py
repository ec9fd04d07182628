"""``stfast.nn.GeoConv``: DeepTTE's geo-convolution on the fused op (:mod:`stfast.ops.geo_conv`)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..ops.geo_conv import geo_conv_packed, geo_conv_padded


class GeoConv(nn.Module):
    """Fused drop-in for :class:`stfast.models.deeptte.GeoConv`: same constructor, same parameters
    (``state_em.weight`` [2, 2], ``proj.weight`` [16, 4], ``proj.bias`` [16], ``conv.weight`` [32, 16, k],
    ``conv.bias`` [32]) created in the same order, so state dicts load both ways and the same seed gives
    the same initial weights; same forward signature and output.

    Shapes: B trips, L points (padded), L' = L − k + 1, N packed points, C = conv_channels.
    """

    def __init__(self, cfg):
        """cfg: :class:`stfast.models.deeptte.DeepTTEConfig` (state_dim, geo_hidden, conv_channels, kernel_size)."""
        super().__init__()
        self.kernel_size = cfg.kernel_size
        self.state_em = nn.Embedding(2, cfg.state_dim)
        self.proj = nn.Linear(2 + cfg.state_dim, cfg.geo_hidden)
        self.conv = nn.Conv1d(cfg.geo_hidden, cfg.conv_channels, cfg.kernel_size)

    def _features(self, lng_n: Tensor, lat_n: Tensor, state: Tensor) -> Tensor:
        x = torch.cat([lng_n.unsqueeze(-1), lat_n.unsqueeze(-1), self.state_em(state.long())], dim=-1)
        return x.to(self.proj.weight.dtype)

    def _weights(self):
        return self.proj.weight, self.proj.bias, self.conv.weight, self.conv.bias

    def forward(self, lng_n: Tensor, lat_n: Tensor, state: Tensor, local_dist_n: Tensor,
                lengths: Tensor | None = None) -> Tensor:
        """lng_n, lat_n: [B, L] normalized coordinates; state: [B, L] 0/1; local_dist_n: [B, L'].
        Returns [B, L', C + 1]. Without ``lengths``: identical to the reference (rows past a trip's own
        L_i − k + 1 are computed from padding and must be masked by the caller). With ``lengths`` [B]
        (points per trip; read on the host: pass the CPU copy, a GPU tensor costs a sync): only real
        rows are computed, the others are zero. Raises ValueError when L < k or a length is < k or > L."""
        x = self._features(lng_n, lat_n, state)
        return geo_conv_padded(x, local_dist_n.to(x.dtype), *self._weights(), lengths=lengths)

    def forward_packed(self, lng_n: Tensor, lat_n: Tensor, state: Tensor, local_dist_n: Tensor,
                       offsets: Tensor) -> Tensor:
        """Packed trips: lng_n, lat_n, state: [N]; offsets: [B + 1] int64, read on the host (pass the CPU
        copy; a GPU tensor costs a sync); local_dist_n: [N − B (k − 1)]. Returns [N − B (k − 1), C + 1];
        trip b's rows start at ``stfast.ops.output_offsets(offsets, k)[b]``. Raises ValueError for
        offsets that do not cut the N points into trips of ≥ k points."""
        x = self._features(lng_n, lat_n, state)
        return geo_conv_packed(x, offsets, local_dist_n.to(x.dtype), *self._weights())
