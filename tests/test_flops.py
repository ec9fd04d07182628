"""stfast.ops.flops: torch's FlopCounterMode counts stfast's ops by the hand formulas (the LSTM over its alive
positions only), and a fused DeepTTE training step as the reference model's, less the reference's padding."""
import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import stfast.ops as so
import stfast.ops.flops as fl
from conftest import random_trips
from stfast.data.dataset import DriverVocab, NormStats, TripDataset
from stfast.models.deeptte import DeepTTE, DeepTTEConfig, combine_loss, loss_parts


def counted(fn) -> dict[str, int]:
    """{op name: FLOPs} that FlopCounterMode counts while ``fn()`` runs."""
    with FlopCounterMode(display=False) as m:
        fn()
    return {str(k): v for k, v in m.get_flop_counts()["Global"].items()}


def lstm_weights(I, H, L, bias=True):
    torch.manual_seed(0)
    ws = []
    for k in range(L):
        ws += [torch.randn(4 * H, I if k == 0 else H), torch.randn(4 * H, H)]
        ws += [torch.randn(4 * H), torch.randn(4 * H)] if bias else []
    return [w.requires_grad_() for w in ws]


@pytest.mark.parametrize("autocast", [False, True])
def test_fused_lstm_counts_its_alive_positions(autocast):
    I, H, L = 5, 6, 2
    ws, lengths = lstm_weights(I, H, L), torch.tensor([7, 4, 2])
    x = torch.randn(3, 7, I, requires_grad=True)

    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            out = so.lstm_padded(x, ws, L, lengths, batch_first=True)[0]
        out.float().sum().backward()

    n = 13  # alive positions: 7 + 4 + 2 of the padded 21
    fwd = 2 * n * 4 * H * (I + H) + 2 * n * 4 * H * (H + H)
    assert counted(step) == {"stfast.lstm_forward": fwd, "stfast.lstm_backward": 2 * fwd}


def test_fused_lstm_without_input_gradient_leaves_out_layer_0s_dx():
    I, H = 5, 6
    ws, x = lstm_weights(I, H, 1, bias=False), torch.randn(9, I)  # x needs no gradient
    offsets = torch.tensor([0, 4, 9])
    c = counted(lambda: so.lstm_packed(x, offsets, ws, 1)[0].sum().backward())
    assert c == {"stfast.lstm_forward": 2 * 9 * 4 * H * (I + H),
                 "stfast.lstm_backward": 2 * 9 * 4 * H * (I + 2 * H)}  # dW_ih, dW_hh, dH; no dX


def test_torch_lstm_counts_every_padded_position():
    I, H, L = 5, 6, 2
    lstm = torch.nn.LSTM(I, H, L, batch_first=True)
    x = torch.randn(3, 7, I, requires_grad=True)
    c = counted(lambda: lstm(x)[0].sum().backward())
    fwd = fl.lstm_flops(21, I, H, L)
    assert fwd == 2 * 21 * 4 * H * (I + H) + 2 * 21 * 4 * H * (H + H)
    assert c == {"aten.mkldnn_rnn_layer": fwd, "aten.mkldnn_rnn_layer_backward": 2 * fwd}


def test_geo_conv_counts_its_projection_and_convolution():
    F_in, H, C, k = 4, 16, 32, 3
    torch.manual_seed(0)
    lens = [5, 3, 8]
    N, n_out = sum(lens), sum(n - k + 1 for n in lens)
    points = torch.randn(N, F_in, requires_grad=True)
    w = [torch.randn(H, F_in), torch.randn(H), torch.randn(C, H, k), torch.randn(C)]
    w = [t.requires_grad_() for t in w]
    offsets = torch.tensor([0, 5, 8, 16])
    c = counted(lambda: so.geo_conv_packed(points, offsets, torch.randn(n_out), *w).sum().backward())
    fwd = 2 * N * F_in * H + 2 * n_out * C * H * k
    assert c == {"stfast.geo_conv_forward": fwd, "stfast.geo_conv_backward": 2 * fwd}


def test_gemm_mm_counts_as_torch_mm():
    a, b = torch.randn(4, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    assert counted(lambda: so.gemm.mm(a, b).sum().backward()) == {"stfast.gemm_mm": 3 * 2 * 4 * 5 * 3}
    assert counted(lambda: (a @ b).sum().backward()) == {"aten.mm": 3 * 2 * 4 * 5 * 3}


def step_flops(kernels: str, trips) -> int:
    """FLOPs of one training step (forward + backward) of DeepTTE with ``kernels`` on all of ``trips``."""
    vocab = DriverVocab(trips.driver)
    torch.manual_seed(0)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab), kernels=kernels), NormStats.from_trips(trips))
    b = TripDataset(trips, vocab, torch.float32).batch(np.arange(len(trips.driver)))

    def step():
        out = model(b)
        p = loss_parts(model, out, b)
        combine_loss(p, 0.3, p.n_trips, p.n_local).backward()

    with FlopCounterMode(display=False) as m:
        step()
    return m.get_total_flops()


@pytest.mark.parametrize("min_len, max_len", [(30, 30), (3, 60)])
def test_fused_step_counts_the_reference_step_less_its_padding(min_len, max_len):
    """Both models run the same products but for two: the reference's geo-conv and nn.LSTM compute every padded
    position, the fused ops only the alive ones (a trip's points, its L − k + 1 windows). So reference − fused
    = 3 × (the forward products on the padded positions): LSTM and geo-conv, each forward + backward (2×) —
    exactly, and 0 for trips of one length. Fails if an op goes uncounted (torch leaves nn.LSTM's oneDNN layer,
    and any op without a formula, at 0) or the LSTM counts padding."""
    trips = random_trips(16, seed=13, min_len=min_len, max_len=max_len)
    cfg = DeepTTEConfig(n_drivers=1)
    lens, k = np.diff(trips.offsets), cfg.kernel_size
    pad_points = len(lens) * lens.max() - lens.sum()
    pad_windows = len(lens) * (lens.max() - k + 1) - (lens - k + 1).sum()
    lstm_in = cfg.conv_channels + 1 + cfg.attr_size
    padding = 3 * (fl.lstm_flops(pad_windows, lstm_in, cfg.hidden_size, cfg.num_layers)
                   + fl.geo_conv_flops(pad_points, pad_windows, 2 + cfg.state_dim, cfg.geo_hidden,
                                       cfg.conv_channels, k))
    fused, reference = step_flops("fused", trips), step_flops("reference", trips)
    alive_lstm = 3 * fl.lstm_flops(lens.sum() - len(lens) * (k - 1), lstm_in, cfg.hidden_size, cfg.num_layers)
    assert alive_lstm < fused < 1.2 * alive_lstm  # the LSTM counted, and most of the step
    assert reference - fused == padding, (reference, fused, padding)
    assert (padding == 0) == (min_len == max_len)
