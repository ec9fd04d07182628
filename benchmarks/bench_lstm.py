"""Fused LSTM benchmarks: stfast.nn.LSTM vs torch.nn.LSTM (H = 128, 2 layers, input 61 — DeepTTE's LSTM),
forward and forward+backward, on packed input (PackedSequence, both), on padded input (both run every
step of the padded batch) and on padded input with lengths (stfast skips the padding; torch.nn.LSTM, which
takes no lengths, runs every step: what each gives a user holding a padded batch), side by side in one run, at Chengdu-like lengths (B = 64, 256) and GeoLife-like
lengths (B = 64), drawn as in bench_geo_conv.py (the samples in ../shared/data, else synthetic stand-ins).
Also the end-to-end DeepTTE training step, kernels="fused" vs "reference".

    pytest benchmarks/bench_lstm.py --benchmark-only --benchmark-group-by=param:shape,param:mode,param:inp
    python benchmarks/bench_lstm.py [--device cuda] [--json out.json]    # ratio table, GFLOP/s vs sgemm

Exit status 4 (``_device.NO_GPU``) when ``--device cuda`` finds no GPU or a CPU-only build.
"""
from __future__ import annotations

import argparse
import json
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _device import NO_GPU, missing_device
from _timing import sync, time_side_by_side
from bench_geo_conv import batch_lengths, source_lengths  # (it puts the repository root on the path)

from stfast.nn import LSTM

I, H, LAYERS, K = 61, 128, 2, 3
SHAPES = [("chengdu", 64), ("chengdu", 256), ("geolife", 64)]
HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


class Case:
    """One batch of LSTM inputs (lengths = trip lengths − k + 1, as after the geo-conv) and the two modules."""

    def __init__(self, shape: str, batch: int, device: str = "cpu", dtype=torch.float32):
        self.lengths = batch_lengths(shape, batch) - (K - 1)
        B, T = len(self.lengths), int(self.lengths.max())
        g = torch.Generator().manual_seed(0)
        self.padded = torch.randn(B, T, I, generator=g).to(device, dtype)
        self.packed = pack_padded_sequence(self.padded, torch.as_tensor(self.lengths), batch_first=True,
                                           enforce_sorted=False)
        torch.manual_seed(0)
        self.ref = torch.nn.LSTM(I, H, LAYERS, batch_first=True).to(device, dtype)
        self.fused = LSTM(I, H, LAYERS, batch_first=True).to(device, dtype)
        self.fused.load_state_dict(self.ref.state_dict())
        self.lengths_t = torch.as_tensor(self.lengths).to(device)
        # "padded": every position of (B, T), both sides (torch.nn.LSTM's semantics without lengths);
        # "padded_lengths": the same padded tensor, stfast given the lengths (it skips the padding),
        # torch computing every position (its only padded option; with lengths it needs packing)
        self.positions = {"packed": int(self.lengths.sum()), "padded": B * T, "padded_lengths": int(self.lengths.sum())}

    def fn(self, impl: str, inp: str, mode: str):
        mod = self.ref if impl == "torch" else self.fused
        x = self.packed if inp == "packed" else self.padded
        kw = {"lengths": self.lengths_t} if inp == "padded_lengths" and impl == "stfast" else {}
        if mode == "fwd":
            def run():
                with torch.no_grad():
                    return mod(x, **kw)
        else:
            params = list(mod.parameters())

            def run():
                out, (h_n, _c_n) = mod(x, **kw)
                data = out.data if inp == "packed" else out
                return torch.autograd.grad(data.sum() + h_n.sum(), params)
        return run

    def gflop(self, inp: str, mode: str) -> float:
        """GEMM work: per layer 2·N·4H·(I_k + H) forward, twice that again backward (input and weight grads)."""
        n = self.positions[inp]
        fwd = sum(2 * n * 4 * H * ((I if k == 0 else H) + H) for k in range(LAYERS))
        return (fwd if mode == "fwd" else 3 * fwd) / 1e9


@cache
def get_case(shape: str, batch: int, device: str) -> Case:
    return Case(shape, batch, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", ["stfast", "torch"])
@pytest.mark.parametrize("inp", ["packed", "padded", "padded_lengths"])
@pytest.mark.parametrize("mode", ["fwd", "fwdbwd"])
@pytest.mark.parametrize("shape,batch", SHAPES)
def test_lstm(benchmark, shape, batch, mode, inp, impl, device):
    case = get_case(shape, batch, device)
    run = case.fn(impl, inp, mode)
    run()
    sync(device)

    def step():
        r = run()
        sync(device)
        return r

    assert benchmark(step) is not None
    benchmark.extra_info.update(positions=case.positions[inp], gflop=case.gflop(inp, mode),
                                lengths_from=source_lengths(shape)[1])


def _train_setup(kernels: str, batch: int, dtype=torch.float32, seed: int = 0):
    from conftest import random_trips

    from stfast.data.dataset import DriverVocab, NormStats, TripDataset
    from stfast.models.deeptte import DeepTTE, DeepTTEConfig

    trips = random_trips(batch, seed=seed, min_len=15, max_len=80)
    vocab = DriverVocab(trips.driver)
    torch.manual_seed(0)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab), kernels=kernels), NormStats.from_trips(trips)).to(dtype)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    return model, opt, TripDataset(trips, vocab, dtype).batch(np.arange(batch))


def _train_step(model, opt, b):
    from stfast.models.deeptte import combine_loss, loss_parts

    out = model(b)
    p = loss_parts(model, out, b)
    loss = combine_loss(p, 0.3, p.n_trips, p.n_local)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


@pytest.mark.parametrize("kernels", ["fused", "reference"])
@pytest.mark.parametrize("batch", [64, 256])
def test_deeptte_train_step(benchmark, batch, kernels):
    model, opt, b = _train_setup(kernels, batch)
    loss = benchmark(lambda: _train_step(model, opt, b))
    assert np.isfinite(loss)
    benchmark.extra_info["trips_per_step"] = batch


def sgemm_gflops(m: int, k: int, n: int, device: str, reps: int = 50) -> float:
    a, b = torch.randn(m, k, device=device), torch.randn(n, k, device=device).t()
    t = time_side_by_side({"mm": lambda: torch.mm(a, b)}, device, reps, 5)["mm"]
    return 2 * m * k * n / t / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    dev = args.device
    if why := missing_device(dev):
        print(why)
        return NO_GPU
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {dev}")
    peak = {"sgemm_big": sgemm_gflops(2048, 512, 512, dev), "sgemm_step": sgemm_gflops(64, 128, 512, dev)}
    print(f"sgemm GFLOP/s: 2048x512x512 {peak['sgemm_big']:.1f}, step shape 64x128x512 {peak['sgemm_step']:.1f}")
    rows = []
    print(f"{'shape':8} {'B':>4} {'mode':7} {'input':14} {'pos':>6} {'stfast ms':>10} {'torch ms':>9} {'x torch':>8} "
          f"{'GFLOP/s':>8}")
    for shape, batch in SHAPES:
        case = Case(shape, batch, dev)
        for mode in ("fwd", "fwdbwd"):
            for inp in ("packed", "padded", "padded_lengths"):
                reps = 10 if dev == "cuda" else 1 if (mode == "fwdbwd" and batch > 64) or shape == "geolife" else 3
                t = time_side_by_side({i: case.fn(i, inp, mode) for i in ("stfast", "torch")}, dev, reps, args.rounds)
                gf = case.gflop(inp, mode) / t["stfast"]
                row = {"shape": shape, "batch": batch, "mode": mode, "input": inp, "positions": case.positions[inp],
                       "T": int(case.lengths.max()), "lengths_from": source_lengths(shape)[1],
                       "stfast_ms": t["stfast"] * 1e3, "torch_ms": t["torch"] * 1e3,
                       "speedup": t["torch"] / t["stfast"], "stfast_gflops": gf, **peak}
                rows.append(row)
                print(f"{shape:8} {batch:4d} {mode:7} {inp:14} {case.positions[inp]:6d} {row['stfast_ms']:10.2f} "
                      f"{row['torch_ms']:9.2f} {row['speedup']:8.2f} {gf:8.1f}")
    if not args.skip_e2e and dev == "cpu":
        for batch in (64, 256):
            setups = {k: _train_setup(k, batch) for k in ("fused", "reference")}
            t = time_side_by_side({k: (lambda s=s: _train_step(*s)) for k, s in setups.items()}, dev, 1, args.rounds)
            row = {"e2e_train_step": True, "batch": batch, "fused_samples_s": batch / t["fused"],
                   "reference_samples_s": batch / t["reference"], "speedup": t["reference"] / t["fused"]}
            rows.append(row)
            print(f"DeepTTE train step B={batch}: fused {row['fused_samples_s']:.0f} samples/s, reference "
                  f"{row['reference_samples_s']:.0f} samples/s, x{row['speedup']:.2f}")
        # same loss for 50 steps in float64
        s64 = {k: _train_setup(k, 32, torch.float64) for k in ("fused", "reference")}
        worst = 0.0
        for _ in range(50):
            lf, lr = _train_step(*s64["fused"]), _train_step(*s64["reference"])
            worst = max(worst, abs(lf - lr) / abs(lr))
        rows.append({"e2e_loss_50_steps_float64_max_rel_diff": worst})
        print(f"DeepTTE 50 Adam steps float64, B=32: max relative loss difference fused vs reference {worst:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
