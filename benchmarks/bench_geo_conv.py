"""Geo-convolution microbenchmarks: the fused op (stfast.nn.GeoConv on packed trips) vs the eager
plain-PyTorch reference (stfast.models.deeptte.GeoConv on the padded batch) vs torch.compile of that
reference, forward and forward+backward, side by side in one run, at two shapes:

- chengdu: B = 64 trips, lengths drawn from the Chengdu sample (../shared/data/chengdu_deeptte_sample/test)
- geolife: B = 64 trips, lengths drawn from the GeoLife sample after preprocessing (load_trips)

Without ../shared/data, fixed synthetic length distributions stand in (the table says so).

    pytest benchmarks/bench_geo_conv.py --benchmark-only --benchmark-group-by=param:shape,param:mode
    python benchmarks/bench_geo_conv.py [--device cuda] [--batch 512] [--json out.json]   # ratio table

Exit status 4 (``_device.NO_GPU``) when ``--device cuda`` finds no GPU or a CPU-only build.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from _device import NO_GPU, missing_device
from _timing import sync, time_side_by_side

# a checkout without an install (gpu_check.sh after build_ext --inplace): stfast from the repository root,
# after an installed one
sys.path.append(str(Path(__file__).resolve().parent.parent))
from stfast.models.deeptte import DeepTTEConfig
from stfast.models.deeptte import GeoConv as ReferenceGeoConv
from stfast.nn import GeoConv

CFG = DeepTTEConfig(n_drivers=4)
K = CFG.kernel_size
HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def _data_dir() -> Path | None:
    env = os.environ.get("STFAST_DATA_DIR")
    here = Path(__file__).resolve().parent.parent
    for c in ([Path(env)] if env else []) + [here.parent / "shared" / "data"]:
        if c.is_dir():
            return c
    return None


@cache
def source_lengths(shape: str) -> tuple[np.ndarray, str]:
    """All trip lengths of the sample behind ``shape`` and where they came from."""
    d = _data_dir()
    if shape == "chengdu" and d is not None and (d / "chengdu_deeptte_sample" / "test").exists():
        from stfast.data.readers import read_deeptte_jsonl

        return read_deeptte_jsonl(d / "chengdu_deeptte_sample" / "test").lengths, "chengdu_deeptte_sample"
    if shape == "geolife" and d is not None and (d / "geolife_sample").exists():
        from stfast.data.load import load_trips

        return load_trips(str(d / "geolife_sample")).lengths, "geolife_sample"
    rng = np.random.default_rng(1234)  # stand-ins with the samples' rough shape
    if shape == "chengdu":
        return np.clip(rng.normal(36, 13, 1400), 15, 126).astype(int), "synthetic"
    return np.clip(rng.lognormal(2.6, 1.1, 290), 3, 593).astype(int), "synthetic"


def batch_lengths(shape: str, batch: int = 64, seed: int = 0) -> np.ndarray:
    lengths, _ = source_lengths(shape)
    lengths = lengths[lengths >= K]
    return np.random.default_rng(seed).choice(lengths, batch, replace=True)


class Case:
    """Padded and packed inputs of one batch, and the three modules with equal weights."""

    def __init__(self, shape: str, device: str = "cpu", batch: int = 64, dtype=torch.float32):
        self.lengths = batch_lengths(shape, batch)
        B, L = len(self.lengths), int(self.lengths.max())
        g = torch.Generator().manual_seed(0)
        self.lng = torch.randn(B, L, generator=g).to(device, dtype)
        self.lat = torch.randn(B, L, generator=g).to(device, dtype)
        self.state = torch.randint(0, 2, (B, L), generator=g).to(device)
        self.ld = torch.randn(B, L - K + 1, generator=g).to(device, dtype)
        lens = torch.as_tensor(self.lengths)
        pmask = (torch.arange(L)[None, :] < lens[:, None]).to(device)
        omask = (torch.arange(L - K + 1)[None, :] < (lens - K + 1)[:, None]).to(device)
        self.p_lng, self.p_lat, self.p_state = self.lng[pmask], self.lat[pmask], self.state[pmask]
        self.p_ld = self.ld[omask]
        # host offsets, as the op reads them (a GPU copy would cost a sync per call)
        self.offsets = torch.tensor([0, *np.cumsum(self.lengths).tolist()], dtype=torch.int64)
        torch.manual_seed(0)
        self.ref = ReferenceGeoConv(CFG).to(device, dtype)
        self.fused = GeoConv(CFG).to(device, dtype)
        self.fused.load_state_dict(self.ref.state_dict())
        self.compiled = torch.compile(self.ref)  # same weights, compiled (compiles on first call)
        self.points, self.padded_points = int(self.lengths.sum()), B * L

    def fn(self, impl: str, mode: str):
        mod = {"eager": self.ref, "compile": self.compiled, "fused": self.fused}[impl]
        if impl == "fused":
            def fwd():
                return mod.forward_packed(self.p_lng, self.p_lat, self.p_state, self.p_ld, self.offsets)
        else:
            def fwd():
                return mod(self.lng, self.lat, self.state, self.ld)
        if mode == "fwd":
            def run():
                with torch.no_grad():
                    return fwd()
        else:
            params = list(mod.parameters())

            def run():
                out = fwd()
                return torch.autograd.grad(out.sum(), params)
        return run


@cache
def get_case(shape: str, device: str) -> Case:
    return Case(shape, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", ["fused", "eager", "compile"])
@pytest.mark.parametrize("mode", ["fwd", "fwdbwd"])
@pytest.mark.parametrize("shape", ["chengdu", "geolife"])
def test_geo_conv(benchmark, shape, mode, impl, device):
    case = get_case(shape, device)
    run = case.fn(impl, mode)
    run()  # warm-up (and compilation)
    sync(device)

    def step():
        r = run()
        sync(device)
        return r

    result = benchmark(step)
    assert result is not None
    benchmark.extra_info.update(points=case.points, padded_points=case.padded_points,
                                lengths_from=source_lengths(shape)[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--shapes", default="chengdu,geolife")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if why := missing_device(args.device):
        print(why)
        return NO_GPU
    rows = []
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {args.device}")
    print(f"{'shape':8} {'mode':7} {'points':>7} {'padded':>7} {'fused ms':>9} {'eager ms':>9} {'compile ms':>10} "
          f"{'x eager':>8} {'x compile':>9}")
    for shape in args.shapes.split(","):
        case = Case(shape, args.device, args.batch)
        for mode in ("fwd", "fwdbwd"):
            t = time_side_by_side({impl: case.fn(impl, mode) for impl in ("fused", "eager", "compile")}, args.device,
                                   warmup=3)
            row = {"shape": shape, "mode": mode, "batch": args.batch, "device": args.device, "points": case.points,
                       "padded_points": case.padded_points, "lengths_from": source_lengths(shape)[1],
                       "fused_ms": t["fused"] * 1e3, "eager_ms": t["eager"] * 1e3, "compile_ms": t["compile"] * 1e3,
                       "speedup_vs_eager": t["eager"] / t["fused"], "speedup_vs_compile": t["compile"] / t["fused"]}
            rows.append(row)
            print(f"{shape:8} {mode:7} {case.points:7d} {case.padded_points:7d} {row['fused_ms']:9.3f} "
                  f"{row['eager_ms']:9.3f} {row['compile_ms']:10.3f} {row['speedup_vs_eager']:8.2f} "
                  f"{row['speedup_vs_compile']:9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
