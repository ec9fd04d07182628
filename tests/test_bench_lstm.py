"""benchmarks/bench_lstm.py: batches drawn as training forms them, and the GEMM accounting its rows report."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_lstm  # noqa: E402
from bench_geo_conv import source_lengths  # noqa: E402


def test_batches_are_length_sorted_chunks_as_in_training():
    """The Chengdu B 64 batch is one of training's (epoch_batches: sorted by length inside chunks), so it pads
    little (training's +9.9 %, issue 44); a uniform draw of the same lengths pads ~2.5x."""
    lengths = bench_lstm.training_lengths("chengdu", 64)
    assert len(lengths) == 64
    padded, valid = len(lengths) * lengths.max(), lengths.sum()
    assert padded / valid < 1.25, (padded, valid)
    src, _ = source_lengths("chengdu")
    src = np.sort(src[src >= bench_lstm.K] - (bench_lstm.K - 1))
    # neighbours in the length order: the batch is a contiguous run of the sorted lengths (one chunk here)
    lo, hi = np.searchsorted(src, lengths.min(), "left"), np.searchsorted(src, lengths.max(), "right")
    assert hi - lo <= 2 * len(lengths), (lengths.min(), lengths.max(), hi - lo)


def test_gemm_list_counts_the_fused_work():
    """The GEMMs timed for the library rate are the fused LSTM's: their FLOPs are the row's GEMM work (per
    layer 2·N·4H·(I_k + H) forward, 3x with backward, less layer 0's input gradient, which the benchmark does
    not ask for, and less the products of step 0 and of h0, which is zero)."""
    lengths = np.array([5, 3, 3, 1])
    H, I, L = bench_lstm.H, bench_lstm.I, bench_lstm.LAYERS
    n, B = lengths.sum(), len(lengths)
    fwd = bench_lstm.gemm_gflop(bench_lstm.gemm_list(lengths, "fwd")) * 1e9
    want_fwd = sum(2 * 4 * H * (n * (I if k == 0 else H) + (n - B) * H) for k in range(L))
    assert fwd == want_fwd
    bwd = bench_lstm.gemm_gflop(bench_lstm.gemm_list(lengths, "fwdbwd")) * 1e9 - fwd
    want_bwd = sum(2 * 4 * H * ((n * H if k > 0 else 0) + n * (I if k == 0 else H) + 2 * (n - B) * H)
                   for k in range(L))
    assert bwd == want_bwd


def test_each_paths_gflop_is_what_torchs_flop_counter_counts():
    """A row's GF/s divides the work each path does, as FlopCounterMode counts it (stfast.ops.flops): the fused
    LSTM over the valid positions without layer 0's input gradient (not asked for here, skipped by the kernel),
    torch.nn.LSTM over the padded ones with it (oneDNN computes it regardless)."""
    from torch.utils.flop_counter import FlopCounterMode

    case = bench_lstm.Case("chengdu", 64)
    for impl in case.impls():
        for mode in ("fwd", "fwdbwd"):
            with FlopCounterMode(display=False) as m:
                case.fn(impl, mode)()
            assert m.get_total_flops() == round(case.gflop(impl, mode) * 1e9), (impl, mode)
    assert case.positions["stfast"] < case.positions["torch"]  # the batch pads: the paths differ
