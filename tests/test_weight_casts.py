"""bf16-mixed casts each weight to bfloat16 once per optimizer step (stfast.ops.weight_casts, issue 51), not once
per forward pass: bitwise the results of a cast per forward pass, with 1 or 3 micro-batches per step; one cast per
weight per step whatever k; never a stale cast after the weights change."""
import contextlib

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import random_trips
from stfast.data.dataset import DriverVocab, NormStats, TripDataset
from stfast.models.deeptte import DeepTTE, DeepTTEConfig
from stfast.nn import Linear
from stfast.ops import weight_casts as kept
from stfast.train import precision, run_data
from stfast.train import trainer as trainer_module
from stfast.train.config import TrainConfig
from stfast.train.trainer import Trainer


@pytest.fixture(scope="module")
def trips_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("weight_casts") / "trips.jsonl"
    random_trips(90, seed=51, min_len=5, max_len=30).to_jsonl(path)
    return str(path)


def _trainer(trips_file, out, k: int, kernels: str = "fused") -> Trainer:
    return Trainer(TrainConfig(data=trips_file, format="deeptte", preset="paper", epochs=1, batch_size=8, seed=3,
                               out=str(out), progress=False, threads=1, precision="bf16-mixed", kernels=kernels,
                               accumulation=f"fixed:{k}"))


def _skip_reference(kernels: str) -> None:
    if kernels == "reference" and (why := precision.stock_bf16_lstm_error()):
        pytest.skip(f"--kernels reference --precision bf16-mixed does not run here: {why}")


class _WeightCasts(TorchDispatchMode):
    """Counts the casts (aten::_to_copy) of each float32 parameter of ``model``, by name."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.names = {p.data_ptr(): n for n, p in model.named_parameters()}
        self.count: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32:
            name = self.names.get(args[0].data_ptr())
            if name is not None:
                self.count[name] = self.count.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _steps(tr: Trainer, k: int, n: int = 3):
    """n optimizer steps of k micro-batches: the losses, and the gradients and parameters after each step."""
    batches = tr.data.epoch_batches(8, 3, 0)
    out = []
    for s in range(n):
        group = batches[s * k:(s + 1) * k]
        loss = tr.train_step(group[0] if k == 1 else group, True)
        assert loss.skipped is None
        out.append((float(loss), {n: p.grad.clone() for n, p in tr.model.named_parameters() if p.grad is not None},
                    {n: p.detach().clone() for n, p in tr.model.named_parameters()}))
    return out


@pytest.mark.parametrize("kernels", ["fused", "reference"])
@pytest.mark.parametrize("k", [1, 3])
def test_kept_casts_give_bitwise_the_steps_of_a_cast_per_forward(trips_file, tmp_path, monkeypatch, k, kernels):
    _skip_reference(kernels)
    kept_run = _steps(_trainer(trips_file, tmp_path / "kept", k, kernels), k)
    # the path before: no block, so every forward pass casts every weight again
    monkeypatch.setattr(trainer_module, "weight_casts", lambda *a: contextlib.nullcontext())
    per_forward = _steps(_trainer(trips_file, tmp_path / "per_forward", k, kernels), k)
    for (loss_a, grads_a, params_a), (loss_b, grads_b, params_b) in zip(kept_run, per_forward):
        assert loss_a == loss_b
        assert grads_a.keys() == grads_b.keys() and all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)
        assert all(torch.equal(params_a[n], params_b[n]) for n in params_a)
    assert not all(torch.equal(kept_run[0][2][n], kept_run[-1][2][n]) for n in kept_run[0][2])  # it trained


@pytest.mark.parametrize("k", [1, 3])
def test_each_weight_is_cast_once_per_optimizer_step_whatever_k(trips_file, tmp_path, k):
    tr = _trainer(trips_file, tmp_path / "run", k)
    batches = tr.data.epoch_batches(8, 3, 0)
    tr.train_step(batches[0] if k == 1 else batches[:k], True)
    for s in (1, 2):  # after an optimizer step the weights are cast again, once
        with _WeightCasts(tr.model) as casts:
            tr.train_step(batches[s * k] if k == 1 else batches[s * k:(s + 1) * k], True)
        # every weight but the embeddings' (not an autocast op: they stay float32) and stfast.nn.Linear's biases
        # (added in float32 to the library's float32 sums), the fused LSTM's included
        uncast = {f"{n}.weight" for n, m in tr.model.named_modules() if isinstance(m, torch.nn.Embedding)}
        uncast |= {f"{n}.bias" for n, m in tr.model.named_modules() if isinstance(m, Linear)}
        expected = {n for n, _ in tr.model.named_parameters() if n not in uncast}
        assert casts.count == dict.fromkeys(expected, 1), casts.count
        assert any(n.startswith("spatio_temporal.lstm.") for n in casts.count)


def test_an_evaluation_casts_each_weight_once(trips_file, tmp_path):
    tr = _trainer(trips_file, tmp_path / "run", 1)
    with _WeightCasts(tr.model) as casts:
        run_data.predict(tr.model, tr.data.train_ds, batch_size=8, precision="bf16-mixed")  # 8 batches
    assert casts.count and set(casts.count.values()) == {1}, casts.count


def _model():
    trips = random_trips(6, seed=5, min_len=4, max_len=20)
    vocab = DriverVocab(trips.driver)
    torch.manual_seed(0)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab)), NormStats.from_trips(trips))
    return model, TripDataset(trips, vocab).batch(np.arange(6))


def _forward(model, b):
    with precision.autocast("bf16-mixed", "cpu"):
        return model(b).time


def test_no_stale_cast_after_the_weights_change(monkeypatch):
    model, b = _model()
    other, _ = _model()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01 * torch.randn_like(p))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)

    def fresh():  # the same forward with casts made for it alone
        return _forward(model, b)

    with precision.weight_casts("bf16-mixed", "cpu", model.parameters()) as block:
        before = _forward(model, b)
        assert torch.equal(_forward(model, b), before) and block.made > 0  # the fused ops' casts were kept...
        made = block.made
        _forward(model, b)
        assert block.made == made  # ... and reused
        before.sum().backward()
        opt.step()  # an optimizer step inside the block
        after_step = _forward(model, b)
        model.load_state_dict(other.state_dict())  # load_state_dict inside the block
        after_load = _forward(model, b)
        w = model.spatio_temporal.lstm.weight_hh_l0
        w.data = w.data.flip(0)  # new storage, same version counter
        after_swap = _forward(model, b)
        with torch.no_grad():  # a cast without autograd history is not reused with grad enabled
            _forward(model, b)
        out = _forward(model, b)
        out.sum().backward()
        assert w.grad is not None and model.entire.inp.weight.grad is not None
    model.load_state_dict(other.state_dict())
    assert not torch.equal(after_step, before) and torch.equal(after_load, fresh())
    assert not torch.equal(after_swap, after_load)
    w.data = w.data.flip(0)
    assert torch.equal(after_swap, fresh()) and torch.equal(out, after_swap)


def test_torch_ops_kept_casts_are_dropped_when_a_weight_changes():
    """torch's own cast cache (linear layers) kept for the block is dropped when a weight changes."""
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    with precision.weight_casts("bf16-mixed", "cpu", lin.parameters()):
        with precision.autocast("bf16-mixed", "cpu"):
            a = lin(x)
        with torch.no_grad():
            lin.weight.mul_(2.0)
        with precision.autocast("bf16-mixed", "cpu"):
            b = lin(x)
    with precision.autocast("bf16-mixed", "cpu"):
        expect = lin(x)
    assert torch.equal(b, expect) and not torch.equal(a, b)


def test_32_and_64_open_no_block():
    for p in ("32", "64"):
        assert isinstance(precision.weight_casts(p, "cpu", []), contextlib.nullcontext)
    with precision.weight_casts("bf16-mixed", "cpu", []):
        assert kept.active() is not None
    assert kept.active() is None


def test_a_fused_ops_kept_cast_follows_its_weight_without_a_check():
    """Inside a block, stfast's fused ops re-cast a weight that changed even under a plain torch.autocast (a loop
    that never calls check()): each kept cast is keyed on its weight's version and storage."""
    from stfast.nn import LSTM

    torch.manual_seed(0)
    lstm = LSTM(4, 8, batch_first=True)
    x = torch.randn(2, 3, 4)
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    with kept.KeptCasts("cpu", lstm.parameters()) as block:
        with bf16():
            a = lstm(x)[0]
        with torch.no_grad():
            lstm.weight_hh_l0.mul_(2.0)
        with bf16():
            b = lstm(x)[0]
    with bf16():
        expect = lstm(x)[0]
    assert torch.equal(b, expect) and not torch.equal(a, b)
    assert block.made == 5  # 4 weights, then weight_hh_l0 again
