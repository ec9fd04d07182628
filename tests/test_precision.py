"""--precision 32 | 64 | bf16-mixed (issue 44): the option and its --dtype alias, the checkpoint that records it,
evaluation and prediction in it, mixed precision's float32 master weights with bfloat16 GEMM operands, and the
reference kernels as stock PyTorch at its best (padded torch.nn.LSTM)."""
import json
import math

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import random_trips
from stfast import cli
from stfast.data.dataset import DriverVocab, NormStats, TripDataset
from stfast.models.deeptte import DeepTTE, DeepTTEConfig, combine_loss, loss_parts
from stfast.train import checkpoint as ckpt
from stfast.train.config import TrainConfig
from stfast.train.precision import stock_bf16_lstm_error
from stfast.train.trained import load_model
from stfast.train.trainer import Trainer

GEMMS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "mkldnn_rnn_layer", "_mkldnn_rnn_layer",
         "lstm", "mkldnn_rnn", "lstm_forward", "geo_conv_forward", "gemm_mm"}


@pytest.fixture(scope="module")
def trips_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("precision") / "trips.jsonl"
    random_trips(90, seed=44, min_len=5, max_len=30).to_jsonl(path)
    return str(path)


def _cfg(trips_file, out, **kw):
    base = {"data": trips_file, "format": "deeptte", "preset": "paper", "epochs": 1, "batch_size": 16, "seed": 1,
            "out": str(out), "progress": False, "threads": 1}
    return TrainConfig(**{**base, **kw})


class _Ops(TorchDispatchMode):
    """The floating dtypes of every GEMM's tensor operands (below autocast: what the kernels get)."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, set] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in GEMMS:
            flat = [a for a in args if isinstance(a, torch.Tensor)]
            flat += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
            self.seen.setdefault(name, set()).update(str(t.dtype) for t in flat if t.is_floating_point())
        return func(*args, **(kwargs or {}))


# ---------------------------------------------------------------- the option
@pytest.mark.parametrize("kw, precision, dtype", [
    ({}, "32", "float32"), ({"dtype": "float64"}, "64", "float64"), ({"dtype": "float32"}, "32", "float32"),
    ({"precision": "64"}, "64", "float64"), ({"precision": "bf16-mixed"}, "bf16-mixed", "float32"),
    ({"precision": "bf16-mixed", "dtype": "float32"}, "bf16-mixed", "float32")])
def test_precision_and_its_dtype_alias_resolve_to_one_setting(kw, precision, dtype):
    cfg = TrainConfig(**kw)
    assert (cfg.precision, cfg.dtype) == (precision, dtype)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_contradicting_precision_and_dtype_are_refused_naming_both(capsys):
    with pytest.raises(ValueError, match="--dtype float64 .* contradicts --precision bf16-mixed"):
        TrainConfig(precision="bf16-mixed", dtype="float64")
    assert cli.main(["train", "--precision", "32", "--dtype", "float64", "--out", "x"]) == 2
    assert "contradicts --precision 32" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["train", "--precision", "16-mixed"])
    a = cli.build_parser().parse_args(["train", "--precision", "bf16-mixed"])
    assert TrainConfig.from_args(a).precision == "bf16-mixed"


def test_a_checkpoint_from_before_precision_reads_as_its_dtype():
    from stfast.train.precision import of_train_config

    assert of_train_config({"dtype": "float64"}) == "64" and of_train_config({}) == "32"
    assert TrainConfig.from_dict({"dtype": "float64", "preset": "paper"}).precision == "64"


# ---------------------------------------------------------------- mixed precision in training
def test_bf16_mixed_keeps_float32_master_weights_and_optimizer_state_with_bf16_gemm_operands(trips_file, tmp_path):
    tr = Trainer(_cfg(trips_file, tmp_path / "run", precision="bf16-mixed", max_steps=3))
    batches = tr.data.epoch_batches(16, 1, 0)
    tr.train_step(batches[0], True)
    mode = _Ops()
    losses = []
    real = tr.steps.model.forward

    def forward(b):  # the loss: float32, from float32 outputs
        out = real(b)
        losses.append((out.time.dtype, out.local_time.dtype))
        return out

    tr.steps.model.forward = forward
    with mode:
        tr.train_step(batches[1], True)
    del tr.steps.model.forward
    assert losses == [(torch.float32, torch.float32)]
    assert {p.dtype for p in tr.model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in tr.model.parameters() if p.grad is not None} == {torch.float32}
    state = [v for s in tr.opt.state.values() for v in s.values() if torch.is_tensor(v) and v.is_floating_point()]
    assert state and {v.dtype for v in state} == {torch.float32}
    # forward GEMMs (linear layers, the fused LSTM) on bfloat16 operands; the geo-conv in float32 on a CPU whose
    # kernel does not take bfloat16 (stfast.ops.autocast)
    assert mode.seen["lstm_forward"] == {"torch.bfloat16"}, mode.seen
    # (stfast::gemm_mm: the linear layers where another library than ATen is chosen for bfloat16, e.g. on AMX)
    assert "torch.bfloat16" in set().union(*(mode.seen.get(op, set()) for op in ("addmm", "mm", "gemm_mm"))), \
        mode.seen
    # and a 32 run sees no bfloat16 at all
    tr32 = Trainer(_cfg(trips_file, tmp_path / "run32", max_steps=3))
    with _Ops() as m32:
        tr32.train_step(batches[1], True)
    assert all(d == {"torch.float32"} for d in m32.seen.values()), m32.seen


def test_reference_kernels_under_bf16_mixed_run_torch_lstm_in_bfloat16(trips_file, tmp_path):
    if why := stock_bf16_lstm_error():
        pytest.skip(why)
    tr = Trainer(_cfg(trips_file, tmp_path / "ref", precision="bf16-mixed", kernels="reference", max_steps=2))
    with _Ops() as m:
        tr.train_step(tr.data.epoch_batches(16, 1, 0)[0], True)
    rnn = {k: v for k, v in m.seen.items() if "rnn" in k or k == "lstm"}
    assert rnn and all(v == {"torch.bfloat16"} for v in rnn.values()), m.seen
    assert m.seen["convolution"] == {"torch.bfloat16"}


@pytest.mark.parametrize("noise, epochs", [("plain", 2), ("adam", 5)])  # adam: past Adam's warm-up (50 steps)
def test_noise_scale_estimates_are_finite_in_bf16_mixed(trips_file, tmp_path, noise, epochs):
    """The accumulation's gradient noise scale reads float32 gradients and Adam state under bf16-mixed."""
    out = tmp_path / "gns"
    Trainer(_cfg(trips_file, out, precision="bf16-mixed", epochs=epochs, batch_size=4, accumulation="1",
                 accum_window=3, noise_scale=noise)).fit()
    windows = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r.get("type") == "window"]
    values = [r["noise_scale"] for r in windows if r["noise_scale"] is not None]
    assert values and all(math.isfinite(v) and v > 0 for v in values), windows
    assert ckpt.load(out / "last.pt")["accumulation"]["noise"]["n"] > 0


def test_reference_kernels_under_bf16_mixed_refused_where_stock_pytorch_cannot(trips_file, tmp_path, capsys):
    """Where stock PyTorch cannot run torch.nn.LSTM under CPU autocast bfloat16 (no AVX-512), the run is refused
    in one line naming the alternatives, with nothing written (before: oneDNN's RuntimeError mid-run)."""
    if stock_bf16_lstm_error() is None:
        pytest.skip("stock PyTorch runs torch.nn.LSTM under CPU autocast bfloat16 on this CPU")
    out = tmp_path / "refused"
    rc = cli.main(["train", "--data", trips_file, "--format", "deeptte", "--preset", "paper", "--epochs", "1",
                   "--kernels", "reference", "--precision", "bf16-mixed", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--kernels fused" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("libraries, said", [(("aten",), True), (("aten", "brgemm"), False),
                                              (("aten", "onednn"), False)])
def test_bf16_mixed_says_when_no_library_takes_bfloat16(trips_file, tmp_path, capsys, monkeypatch, libraries, said):
    """A bf16-mixed CPU run notes, once, that --precision 32 is faster where only ATen takes bfloat16 operands (it
    widens them to float32), as the libraries report it (AMD EPYC Zen 3: 0.85× the trips/s of 32); not where a
    16-bit library exists, nor in --precision 32."""
    from stfast.ops import gemm

    real = gemm.gemm_libraries_available
    monkeypatch.setattr(gemm, "gemm_libraries_available",
                        lambda d, o=None: libraries if d == torch.bfloat16 else real(d, o))
    for precision in ("bf16-mixed", "32"):
        Trainer(_cfg(trips_file, tmp_path / precision, precision=precision, max_steps=1)).fit()
        out = capsys.readouterr().out
        assert out.count("--precision 32 is faster here") == (1 if said and precision == "bf16-mixed" else 0), out


# ---------------------------------------------------------------- the checkpoint, evaluate, predict
def test_checkpoint_records_precision_and_evaluate_predict_use_it_unless_told(trips_file, tmp_path, capsys):
    out = tmp_path / "bf"
    Trainer(_cfg(trips_file, out, precision="bf16-mixed", max_steps=4)).fit()
    state = ckpt.load(out / "checkpoint.pt")
    assert state["train_config"]["precision"] == "bf16-mixed" and state["train_config"]["dtype"] == "float32"
    m = load_model(out / "checkpoint.pt")
    assert m.precision == "bf16-mixed" and m.dtype == torch.float32
    trips = m.split(m.load_trips(), "test")
    ds = TripDataset(trips, m.drivers, torch.float32)
    b = ds.batch(np.argsort(ds.lengths, kind="stable"))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        by_hand = m.model(b).time.double().numpy()
    with torch.no_grad():
        in_32 = m.model(b).time.double().numpy()
    order = np.argsort(ds.lengths, kind="stable")
    pred = np.empty(len(trips))
    pred[order] = by_hand
    np.testing.assert_array_equal(m.predict(trips), pred)
    assert not np.array_equal(by_hand, in_32)  # bfloat16 GEMMs give other numbers than float32
    m64 = load_model(out / "checkpoint.pt", precision="64")
    assert m64.precision == "64" and m64.dtype == torch.float64
    # the command line: evaluate and predict take the checkpoint's precision, --precision overrides it
    base = ["--checkpoint", str(out / "checkpoint.pt"), "--split", "test"]
    seen = []
    real = cli.__dict__.get("_predict")

    def spy(a):
        trips_, pred_, *rest = real(a)  # rest: which trips lie outside the training area, have unseen drivers
        seen.append(pred_)
        return (trips_, pred_, *rest)

    cli._predict = spy
    try:
        assert cli.main(["evaluate", *base]) == 0
        assert cli.main(["evaluate", *base, "--precision", "32"]) == 0
        assert cli.main(["predict", *base, "--out", str(tmp_path / "p.csv")]) == 0
    finally:
        cli._predict = real
    np.testing.assert_array_equal(seen[0], m.predict(trips))
    np.testing.assert_array_equal(seen[2], seen[0])
    assert not np.array_equal(seen[1], seen[0])
    assert "MAPE" in capsys.readouterr().out


def test_resume_continues_in_the_runs_precision_and_refuses_another(trips_file, tmp_path):
    out = tmp_path / "run"
    Trainer(_cfg(trips_file, out, precision="bf16-mixed", max_steps=2)).fit()
    cfg = _cfg(trips_file, out, resume=True, max_steps=3)  # neither --precision nor --dtype: the run's
    assert cfg.precision == "bf16-mixed"
    with pytest.raises(ValueError, match="--precision bf16-mixed in the checkpoint, 32 now"):
        Trainer(_cfg(trips_file, out, resume=True, max_steps=3, precision="32"))


# ---------------------------------------------------------------- reference kernels: stock PyTorch at its best
def test_reference_kernels_are_padded_torch_lstm_equal_to_fused(monkeypatch):
    """--kernels reference runs torch.nn.LSTM once over the padded batch (oneDNN on the CPU), no packing, its
    outputs past each length zeroed; same parameters and initialization as the fused model; the outputs and
    gradients agree in float32 to rounding."""
    import torch.nn.utils.rnn as rnn

    def refuse(*a, **k):
        raise AssertionError("the reference packs its batch")

    monkeypatch.setattr(rnn, "pack_padded_sequence", refuse)
    trips = random_trips(9, seed=7, min_len=4, max_len=40)
    vocab = DriverVocab(trips.driver)
    b = TripDataset(trips, vocab).batch(np.arange(9))
    res = {}
    for kernels in ("reference", "fused"):
        torch.manual_seed(3)
        model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab), kernels=kernels), NormStats.from_trips(trips))
        calls = []
        model.spatio_temporal.lstm.register_forward_hook(lambda mod, args, out: calls.append(args[0]))
        out = model(b)
        p = loss_parts(model, out, b)
        combine_loss(p, 0.3, p.n_trips, p.n_local).backward()
        res[kernels] = (model.state_dict(), out, {n: q.grad for n, q in model.named_parameters()}, calls)
        if kernels == "reference":
            assert type(model.spatio_temporal.lstm) is torch.nn.LSTM
    (s_r, o_r, g_r, c_r), (s_f, o_f, g_f, _) = res["reference"], res["fused"]
    assert len(c_r) == 1 and isinstance(c_r[0], torch.Tensor) and c_r[0].dim() == 3  # padded [B, L', I]
    assert all(torch.equal(s_r[k], s_f[k]) for k in s_r)  # same initial weights for a seed
    torch.testing.assert_close(o_r.time, o_f.time, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(o_r.local_time[o_r.mask], o_f.local_time[o_f.mask], rtol=1e-5, atol=1e-3)
    for n in g_r:
        torch.testing.assert_close(g_r[n], g_f[n], rtol=1e-4, atol=1e-5, msg=n)


def test_bench_modes_runs_its_modes_in_bf16_mixed(tmp_path):
    out = tmp_path / "bench"
    assert cli.main(["bench", "modes", "--n-synthetic", "200", "--budget-s", "4", "--target-mape", "80", "--batch-size",
                     "16", "--nproc", "1", "--threads", "1", "--precision", "bf16-mixed", "--only",
                     "single process, fused kernels", "--out", str(out)]) == 0
    runs = json.loads((out / "modes.json").read_text())["modes"]["single process, fused kernels"]["runs"]
    assert runs[0]["samples_per_s"] > 0 and 0 < runs[0]["test_mape"] < 5
    (checkpoint,) = out.glob("**/checkpoint.pt")
    assert ckpt.load(checkpoint)["train_config"]["precision"] == "bf16-mixed"


def test_component_executor_lanes_run_under_the_callers_autocast():
    """--parallel cp under bf16-mixed: autocast is per thread; the executor's worker lanes take the caller's up for
    forwards and losses (the same numbers as the plain model under autocast) and leave it for backwards."""
    from stfast.parallel.components import ComponentExecutor, ComponentPlan

    trips = random_trips(8, seed=5, min_len=4, max_len=30)
    vocab = DriverVocab(trips.driver)
    torch.manual_seed(0)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab)), NormStats.from_trips(trips))
    b = TripDataset(trips, vocab).batch(np.arange(8))
    ex = ComponentExecutor(ComponentPlan.concurrent(model.component_graph(), "cpu"), micro_batches=1, threads=True)
    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)
    with torch.no_grad():
        with bf16:
            expect, got = model(b).time, ex.forward(b).time
        plain = model(b).time
    ex.close()
    assert torch.equal(got, expect) and not torch.equal(plain, expect)
