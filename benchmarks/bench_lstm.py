"""Fused LSTM benchmarks: stfast.nn.LSTM vs stock PyTorch at its best — torch.nn.LSTM on the padded batch
(oneDNN's fused RNN on the CPU, cuDNN on CUDA), outputs zeroed past each length (a unidirectional LSTM never
looks ahead, so its outputs at valid positions are the packed ones) — with DeepTTE's LSTM (H = 128, 2 layers,
input 61), forward and forward+backward, in float32 and bfloat16 (torch: bfloat16 weights and inputs, and
float32 under ``torch.autocast``; the faster is its figure), side by side in one run.

Batches are formed as training forms them (stfast.data.batches.epoch_batches: shuffled, sorted by length
inside chunks), from the trip lengths of the samples in ../shared/data (Chengdu B = 64, 256; GeoLife B = 64;
synthetic stand-ins without them): the batch of median total length of epoch 0. Each row reports GFLOP/s of
every path (GEMM work as torch's FlopCounterMode counts it with stfast.ops.flops: the valid positions for
stfast, the padded ones for torch) beside the rate of each GEMM library (the micro-kernel, brgemm, among them)
on exactly the fused LSTM's GEMMs (its projections, per-step recurrent products and backward products at this
batch's step sizes), measured in the same run. Also the end-to-end DeepTTE training step, kernels="fused" vs
"reference".

    pytest benchmarks/bench_lstm.py --benchmark-only --benchmark-group-by=param:dtype,param:shape,param:mode
    python benchmarks/bench_lstm.py [--device cuda] [--threads N] [--json out.json]    # acceptance table

Exit status 4 (``_device.NO_GPU``) when ``--device cuda`` finds no GPU or a CPU-only build.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import nullcontext
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _device import NO_GPU, cpu_summary, missing_device
from _timing import sync, time_side_by_side
from bench_geo_conv import source_lengths  # (it puts the repository root on the path)

from stfast.nn import LSTM
from stfast.ops.flops import lstm_flops
from stfast.ops.gemm import LIBRARIES, USES, gemm_library
from stfast.train.precision import stock_bf16_lstm_error
from stfast.data.batches import epoch_batches

I, H, LAYERS, K = 61, 128, 2, 3
SHAPES = [("chengdu", 64), ("chengdu", 256), ("geolife", 64)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
IMPLS = ["stfast", "torch", "torch_autocast"]  # torch_autocast: float32 module and input under autocast
HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def training_lengths(shape: str, batch: int, seed: int = 0) -> np.ndarray:
    """LSTM lengths (trip length − k + 1, as after the geo-conv) of one full batch of epoch 0 as training
    draws it (:func:`stfast.data.batches.epoch_batches`): the batch of median total length."""
    lengths, _ = source_lengths(shape)
    lengths = lengths[lengths >= K]
    full = [b for b in epoch_batches(lengths, batch, seed, 0) if len(b) == batch]
    totals = np.array([lengths[b].sum() for b in full])
    median = full[int(np.argsort(totals, kind="stable")[len(full) // 2])]
    return lengths[median] - (K - 1)


def gemm_list(lengths: np.ndarray, mode: str, input_grad: bool = False) -> list[tuple[int, int, int, bool, str]]:
    """(M, K, N, a_transposed, use) of every GEMM the fused LSTM runs for these lengths (per layer: the input
    projection, one recurrent product per step over the sequences alive; backward: one per step, the input
    gradient unless layer 0's input needs none, the two weight gradients, whose left operand is dGᵀ). use:
    "step" for the recurrent products (their weight prepared once per call), "bulk" for the rest
    (stfast.ops.gemm.USES)."""
    n, B = int(lengths.sum()), len(lengths)
    alive = [int((lengths > t).sum()) for t in range(int(lengths.max()))]
    out = []
    for k in range(LAYERS):
        i_k = I if k == 0 else H
        out.append((n, i_k, 4 * H, False, "bulk"))
        out += [(bs, H, 4 * H, False, "step") for bs in alive[1:]]
        if mode == "fwdbwd":
            out += [(bs, 4 * H, H, False, "step") for bs in alive[1:]]
            if k > 0 or input_grad:
                out.append((n, 4 * H, i_k, False, "bulk"))
            out += [(4 * H, n, i_k, True, "bulk"), (4 * H, n - B, H, True, "bulk")]
    return out


def gemm_gflop(shapes) -> float:
    return sum(2 * s[0] * s[1] * s[2] for s in shapes) / 1e9


def library_gemm_rates(shapes, dtype: torch.dtype, device: str) -> dict:
    """GFLOP/s of each GEMM library (stfast.ops.gemm) on exactly ``shapes`` (operands in ``dtype``, float32
    output for 16-bit operands, as the fused LSTM accumulates), per use, timed side by side in this run (the
    micro-kernel's "step" rate with the weight packed once, as the kernels run it); on CUDA, ATen's (cuBLAS).
    Returns {"rates": {use: {library: GFLOP/s}}, "chosen": {use: library}, "best": {use: library},
    "gemm_only_s": the shapes' time at each use's best rate}."""
    if device != "cpu":
        ops = [(torch.randn(m, k, device=device, dtype=dtype), torch.randn(n, k, device=device, dtype=dtype).t())
               for m, k, n, *_ in shapes]
        t = time_side_by_side({"cublas": lambda: [torch.mm(a, b) for a, b in ops]}, device, 1, 5)
        return {"rates": {"all": {"cublas": gemm_gflop(shapes) / t["cublas"]}}, "chosen": {"all": "cublas"},
                "best": {"all": "cublas"}, "gemm_only_s": t["cublas"]}
    out_dtype = torch.float32
    res = {"rates": {}, "chosen": {}, "best": {}, "gemm_only_s": 0.0}
    for use in USES:
        part = [s for s in shapes if s[4] == use]
        if not part:
            continue
        flat = [int(v) for s in part for v in s[:4]]
        rates = dict(zip(LIBRARIES, torch.ops.stfast.gemm_rates_at(dtype, out_dtype, USES.index(use), flat)))
        res["rates"][use] = {lib: r for lib, r in rates.items() if r > 0}
        res["chosen"][use] = gemm_library(dtype, out_dtype, use=use)
        res["best"][use] = max(res["rates"][use], key=res["rates"][use].get)
        res["gemm_only_s"] += gemm_gflop(part) / res["rates"][use][res["best"][use]]
    return res


class Case:
    """One training-formed batch of LSTM inputs in one dtype, stfast.nn.LSTM and torch.nn.LSTM with equal weights."""

    def __init__(self, shape: str, batch: int, device: str = "cpu", dtype: torch.dtype = torch.float32):
        self.lengths = training_lengths(shape, batch)
        self.device, self.dtype = device, dtype
        B, T = len(self.lengths), int(self.lengths.max())
        g = torch.Generator().manual_seed(0)
        lens = torch.as_tensor(self.lengths)
        self.mask = (torch.arange(T)[None, :] < lens[:, None]).to(device)  # (B, T) valid positions
        self.padded32 = (torch.randn(B, T, I, generator=g) * self.mask[..., None].cpu()).to(device)
        self.padded = self.padded32.to(dtype)
        self.packed = self.padded[self.mask]  # (N, I) CSR rows, sequence by sequence
        self.offsets = torch.tensor([0, *np.cumsum(self.lengths).tolist()], dtype=torch.int64)
        torch.manual_seed(0)
        self.ref32 = torch.nn.LSTM(I, H, LAYERS, batch_first=True).to(device)
        self.ref = self.ref32 if dtype == torch.float32 else torch.nn.LSTM(I, H, LAYERS, batch_first=True).to(device,
                                                                                                             dtype)
        self.ref.load_state_dict(self.ref32.state_dict())
        self.fused = LSTM(I, H, LAYERS, batch_first=True).to(device, dtype)
        self.fused.load_state_dict(self.ref32.state_dict())
        self.positions = {"stfast": int(self.lengths.sum()), "torch": B * T, "torch_autocast": B * T}

    def fn(self, impl: str, mode: str):
        """A callable running ``impl`` once (``mode`` "fwd": no grad; "fwdbwd": gradients of every weight)."""
        if impl == "stfast":
            mod, params = self.fused, list(self.fused.parameters())

            def forward():
                out, (h_n, _c) = mod.forward_packed(self.packed, self.offsets)
                return out, h_n
        else:
            autocast = impl == "torch_autocast"
            mod = self.ref32 if autocast else self.ref
            params, x = list(mod.parameters()), self.padded32 if autocast else self.padded
            ctx = (lambda: torch.autocast(self.device, torch.bfloat16)) if autocast else nullcontext
            mask = self.mask[..., None]

            def forward():
                with ctx():
                    out, (h_n, _c) = mod(x)
                    return out * mask, h_n  # zero past each length: the stock model's padded use

        if mode == "fwd":
            def run():
                with torch.no_grad():
                    return forward()
        else:
            def run():
                out, h_n = forward()
                return torch.autograd.grad(out.float().sum() + h_n.float().sum(), params)
        return run

    def impls(self) -> list[str]:
        """stfast and stock PyTorch's forms: under autocast in bfloat16 where stock PyTorch can run it (on a CPU
        without AVX-512 its oneDNN RNN refuses bfloat16: stfast.train.precision.stock_bf16_lstm_error)."""
        autocast = self.dtype == torch.bfloat16 and (self.device != "cpu" or stock_bf16_lstm_error() is None)
        return ["stfast", "torch"] + (["torch_autocast"] if autocast else [])

    def gflop(self, impl: str, mode: str) -> float:
        """GEMM work of ``impl`` as torch's FlopCounterMode counts it with stfast.ops.flops: per layer
        2·n·4H·(I_k + H) forward over its n positions (valid for stfast, padded for torch), twice that again
        backward (input and weight gradients), less layer 0's input gradient for stfast, which this benchmark
        does not ask for and the kernel skips (oneDNN's backward computes it regardless)."""
        if mode == "fwd":
            return lstm_flops(self.positions[impl], I, H, LAYERS) / 1e9
        return (lstm_flops(self.positions[impl], I, H, LAYERS) + lstm_flops(
            self.positions[impl], I, H, LAYERS, backward=True, input_grad=impl != "stfast")) / 1e9


@cache
def get_case(shape: str, batch: int, device: str, dtype: str) -> Case:
    return Case(shape, batch, device, DTYPES[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mode", ["fwd", "fwdbwd"])
@pytest.mark.parametrize("shape,batch", SHAPES)
def test_lstm(benchmark, shape, batch, mode, dtype, impl, device):
    case = get_case(shape, batch, device, dtype)
    if impl not in case.impls():
        pytest.skip("autocast is the bfloat16 rows' baseline" if dtype != "bfloat16" else stock_bf16_lstm_error())
    run = case.fn(impl, mode)
    run()
    sync(device)

    def step():
        r = run()
        sync(device)
        return r

    assert benchmark(step) is not None
    benchmark.extra_info.update(positions=case.positions[impl], gflop=case.gflop(impl, mode),
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


def acceptance_rows(device: str, rounds: int, shapes=SHAPES, dtypes=tuple(DTYPES), modes=("fwd", "fwdbwd")):
    """One row per (dtype, shape, mode): stfast vs torch's best, milliseconds, ratio, GFLOP/s beside the best
    library GEMM rate on the fused LSTM's own GEMMs (measured here, in this run)."""
    rows = []
    for dtype in dtypes:
        for shape, batch in shapes:
            case = Case(shape, batch, device, DTYPES[dtype])
            for mode in modes:
                gemms = gemm_list(case.lengths, mode)
                lib = library_gemm_rates(gemms, DTYPES[dtype], device)
                reps = 10 if device == "cuda" else 1 if (mode == "fwdbwd" and batch > 64) or shape == "geolife" else 3
                t = time_side_by_side({i: case.fn(i, mode) for i in case.impls()}, device, reps, rounds)
                best_torch = min((i for i in case.impls() if i != "stfast"), key=t.get)
                rows.append({
                    "dtype": dtype, "shape": shape, "batch": batch, "mode": mode, "lengths_from": source_lengths(shape)[1],
                    "valid_positions": case.positions["stfast"], "padded_positions": case.positions["torch"],
                    "stfast_ms": t["stfast"] * 1e3, **{f"{i}_ms": t[i] * 1e3 for i in case.impls() if i != "stfast"},
                    "torch_best": best_torch, "speedup": t[best_torch] / t["stfast"],
                    "stfast_gflops": case.gflop("stfast", mode) / t["stfast"],
                    "torch_gflops": case.gflop(best_torch, mode) / t[best_torch],
                    "gflops": {i: case.gflop(i, mode) / t[i] for i in case.impls()},
                    "gemm_gflops": gemm_gflop(gemms) / lib["gemm_only_s"], "gemm_rates": lib["rates"],
                    "gemm_chosen": lib["chosen"], "gemm_best": lib["best"], "gemm_only_ms": lib["gemm_only_s"] * 1e3})
    return rows


def print_rows(rows) -> None:
    """The acceptance table, then per row and use the GEMM rates of each library on the row's own products
    (the micro-kernel, brgemm, beside the others) and the library stfast chose (*)."""
    print(f"{'dtype':9} {'shape':8} {'B':>4} {'mode':7} {'valid':>6} {'padded':>6} {'stfast ms':>9} {'torch ms':>9} "
          f"{'torch is':>15} {'x torch':>7} {'stfast GF/s':>11} {'torch GF/s':>10} {'GEMM GF/s':>9} "
          f"{'GEMM-only ms':>12}")
    for r in rows:
        print(f"{r['dtype']:9} {r['shape']:8} {r['batch']:4d} {r['mode']:7} {r['valid_positions']:6d} "
              f"{r['padded_positions']:6d} {r['stfast_ms']:9.2f} {r[r['torch_best'] + '_ms']:9.2f} "
              f"{r['torch_best']:>15} {r['speedup']:7.2f} {r['stfast_gflops']:11.1f} {r['torch_gflops']:10.1f} "
              f"{r['gemm_gflops']:9.1f} {r['gemm_only_ms']:12.2f}")
    print("GF/s of every path, then each GEMM library's GF/s per use on the row's own products (* stfast's choice):")
    for r in rows:
        per_use = "; ".join(f"{use}: " + ", ".join(f"{lib}{'*' if lib == r['gemm_chosen'][use] else ''} {v:.0f}"
                                                   for lib, v in rates.items())
                            for use, rates in r["gemm_rates"].items())
        paths = ", ".join(f"{i} {v:.0f}" for i, v in r["gflops"].items())
        print(f"  {r['dtype']:9} {r['shape']:8} {r['batch']:4d} {r['mode']:7} {paths} | {per_use}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtype", choices=list(DTYPES), action="append", help="(repeatable; default: all)")
    ap.add_argument("--shape", choices=sorted({s for s, _ in SHAPES}), action="append",
                    help="(repeatable; default: all)")
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    dev = args.device
    if why := missing_device(dev):
        print(why)
        return NO_GPU
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    pairs = [(torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)]
    libs = {f"{str(a)[6:]}->{str(o)[6:]}@{use}": gemm_library(a, o, use=use) for a, o in pairs for use in USES} \
        if dev == "cpu" else {}
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {dev}, {cpu_summary()}")
    print(f"GEMM library chosen (stfast.ops.gemm_library): {libs}")
    shapes = [s for s in SHAPES if args.shape is None or s[0] in args.shape]
    rows = acceptance_rows(dev, args.rounds, shapes, tuple(args.dtype or DTYPES))
    print_rows(rows)
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
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
