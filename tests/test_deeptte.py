"""DeepTTE reference model: shapes, and one test per fault of the original (docs DEEPTTE.md)."""
import numpy as np
import pytest
import torch

from conftest import random_trips
from stfast.data.dataset import DriverVocab, NormStats, TripDataset, local_spans
from stfast.models.deeptte import DeepTTE, DeepTTEConfig, combine_loss, loss_parts


def build(trips, compat="fixed", dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    vocab = DriverVocab(trips.driver)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab), compat=compat), NormStats.from_trips(trips)).to(dtype)
    return model, TripDataset(trips, vocab, dtype)


def test_output_shapes_and_units():
    trips = random_trips(6, seed=1)
    model, ds = build(trips)
    out = model(ds.batch(np.arange(6)))
    assert out.time.shape == (6,)
    assert out.local_time.shape == (6, int(trips.lengths.max()) - 2)
    assert out.mask.sum().item() == int((trips.lengths - 2).sum())
    # de-normalized seconds: an untrained model sits near the training mean time, not near 0
    assert abs(out.time.mean().item() - trips.time.mean()) < 5 * trips.time.std()


@pytest.mark.parametrize("compat,equal", [("fixed", True), ("original", False)])
def test_fault1_attention_ignores_padding(compat, equal):
    trips = random_trips(2, seed=2, min_len=5, max_len=6)
    long = random_trips(1, seed=3, min_len=80, max_len=80)
    from stfast.data.trips import Trips
    both = Trips.concat([trips, long])
    model, ds = build(both, compat)
    model.eval()
    alone = model(ds.batch([0, 1])).time
    padded = model(ds.batch([0, 1, 2])).time[:2]
    assert torch.allclose(alone, padded, rtol=0, atol=1e-9) == equal


@pytest.mark.parametrize("compat", ["fixed", "original"])
def test_fault2_dist_normalized_once(compat):
    trips = random_trips(5, seed=4)
    model, ds = build(trips, compat)
    seen = {}
    model.attr.register_forward_hook(lambda m, args, out: seen.update(dist=args[3]))
    b = ds.batch(np.arange(5))
    model(b)
    once = (b.dist - trips.dist.mean()) / trips.dist.std()
    assert torch.allclose(seen["dist"], once, atol=1e-9) == (compat == "fixed")


def test_fault4_stats_describe_the_normalized_quantity():
    trips = random_trips(30, seed=5)
    st = NormStats.from_trips(trips, kernel_size=3)
    spans = np.concatenate([trips.dist_gap[s][2:] - trips.dist_gap[s][:-2]
                            for s in (trips.points(i) for i in range(len(trips)))])
    assert st.local_dist_mean == pytest.approx(spans.mean(), rel=1e-12)
    assert st.local_dist_std == pytest.approx(spans.std(), rel=1e-12)
    steps = np.concatenate([np.diff(trips.dist_gap[trips.points(i)]) for i in range(len(trips))])
    assert abs(st.local_dist_mean - steps.mean()) > 0.1 * steps.mean()  # per-step stats would be wrong
    tspans = local_spans(trips, trips.time_gap, 3)
    assert st.local_time_mean == pytest.approx(tspans.mean(), rel=1e-12)


def test_fault5_batch_of_one_and_last_smaller_batch():
    trips = random_trips(5, seed=6)
    model, ds = build(trips)
    for idx in ([3], [0, 1, 2], [4]):
        b = ds.batch(idx)
        out = model(b)
        assert out.time.shape == (len(idx),)
        p = loss_parts(model, out, b)
        loss = combine_loss(p, 0.3, p.n_trips, p.n_local)
        loss.backward()
        assert torch.isfinite(loss) and loss.item() > 0
        assert all(torch.isfinite(q.grad).all() for q in model.parameters() if q.grad is not None)


def test_fault6_driver_vocab_from_data_with_unknown_index():
    trips = random_trips(20, seed=7, n_drivers=5)
    vocab = DriverVocab(trips.driver)
    assert len(vocab) == len(set(trips.driver)) + 1
    assert vocab.encode(np.array(["never-seen", trips.driver[0]], object)).tolist() == [0, vocab.index[trips.driver[0]]]
    model, _ = build(trips)
    assert model.attr.driver.num_embeddings == len(vocab)
    test = random_trips(3, seed=8, n_drivers=50)  # drivers d5..d49 unseen
    out = model(TripDataset(test, vocab, torch.float64).batch([0, 1, 2]))
    assert torch.isfinite(out.time).all()


def test_fault7_short_trip_rejected_with_clear_error():
    trips = random_trips(3, seed=9, min_len=2, max_len=2)
    model, ds = build(random_trips(4, seed=10))
    short = TripDataset(trips, DriverVocab([]), torch.float64)
    with pytest.raises(ValueError, match="kernel_size=3"):
        model(short.batch([0]))


def test_trip_estimate_independent_of_batch_companions():
    trips = random_trips(8, seed=11)
    model, ds = build(trips)
    model.eval()
    full = model(ds.batch(np.arange(8))).time
    single = torch.stack([model(ds.batch([i])).time[0] for i in range(8)])
    torch.testing.assert_close(full, single, rtol=1e-10, atol=1e-8)


def test_gradcheck_float64_small_model():
    trips = random_trips(3, seed=12, min_len=4, max_len=6)
    vocab = DriverVocab(trips.driver)
    cfg = DeepTTEConfig(n_drivers=len(vocab), hidden_size=6, geo_hidden=4, conv_channels=5, local_hidden=(4, 3))
    torch.manual_seed(0)
    model = DeepTTE(cfg, NormStats.from_trips(trips)).double()
    b = TripDataset(trips, vocab, torch.float64).batch([0, 1, 2])
    w = model.entire.inp.weight

    def f(weight):
        with torch.no_grad():
            w.copy_(weight)
        return model(b).time

    # gradient of the output w.r.t. the first entire-estimator weight by autograd vs finite differences
    out = model(b).time.sum()
    (g,) = torch.autograd.grad(out, w)
    eps = 1e-6
    i, j = 1, 3
    w0 = w.detach().clone()
    wp, wm = w0.clone(), w0.clone()
    wp[i, j] += eps
    wm[i, j] -= eps
    fd = (f(wp).sum() - f(wm).sum()) / (2 * eps)
    f(w0)
    assert g[i, j].item() == pytest.approx(fd.item(), rel=1e-5, abs=1e-8)


def test_fused_and_reference_kernels_give_the_same_model():
    trips = random_trips(7, seed=13, min_len=3, max_len=30)
    vocab = DriverVocab(trips.driver)
    outs = {}
    for kernels in ("reference", "fused"):
        torch.manual_seed(0)
        model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab), kernels=kernels), NormStats.from_trips(trips)).double()
        b = TripDataset(trips, vocab, torch.float64).batch(np.arange(7))
        out = model(b)
        p = loss_parts(model, out, b)
        combine_loss(p, 0.3, p.n_trips, p.n_local).backward()
        outs[kernels] = (model.state_dict(), out.time.detach(), {n: q.grad for n, q in model.named_parameters()})
    (sr, tr, gr), (sf, tf, gf) = outs["reference"], outs["fused"]
    assert sr.keys() == sf.keys()
    torch.testing.assert_close(tf, tr, rtol=1e-10, atol=1e-8)
    for n in gr:
        torch.testing.assert_close(gf[n], gr[n], rtol=1e-9, atol=1e-10, msg=n)


@pytest.mark.slow
def test_fused_model_under_torch_compile_fullgraph():
    """The whole DeepTTE model with fused ops compiles without a graph break and gives the eager results.
    (The fused geo-conv packs by boolean masks, whose sizes depend on the data: dynamo captures them as
    unbacked sizes with capture_dynamic_output_shape_ops.)"""
    trips = random_trips(5, seed=14, min_len=3, max_len=20)
    vocab = DriverVocab(trips.driver)
    torch.manual_seed(0)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab), kernels="fused"), NormStats.from_trips(trips))
    b = TripDataset(trips, vocab, torch.float32).batch(np.arange(5))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        compiled = torch.compile(model, fullgraph=True)
        out = compiled(b)
    expect = model(b)
    torch.testing.assert_close(out.time, expect.time)
    torch.testing.assert_close(out.local_time[expect.mask], expect.local_time[expect.mask])
    p, pe = loss_parts(model, out, b), loss_parts(model, expect, b)
    w = model.spatio_temporal.lstm.weight_hh_l1
    (g,) = torch.autograd.grad(combine_loss(p, 0.3, p.n_trips, p.n_local), [w])
    (ge,) = torch.autograd.grad(combine_loss(pe, 0.3, pe.n_trips, pe.n_local), [w])
    torch.testing.assert_close(g, ge)


class _DeviceLengths(torch.Tensor):
    """Lengths standing in for a GPU copy (issue 38): every host read of them, or of a value computed from
    them (int(), .item(), .tolist(), .cpu(), .to("cpu"), ...), is recorded — on a GPU each is a sync."""

    reads: list = []
    HOST = {"__int__", "__index__", "__bool__", "__float__", "item", "tolist", "numpy", "cpu", "__array__"}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        to_cpu = name == "to" and any(str(a) == "cpu" for a in [*args[1:], *kwargs.values()])
        if name in cls.HOST or to_cpu:
            cls.reads.append(name)
        return super().__torch_function__(func, types, args, kwargs)


@pytest.mark.parametrize("kernels", ["fused", "reference"])
def test_a_step_reads_lengths_from_the_batch_host_copy_only(kernels):
    """TripBatch keeps a CPU copy of the lengths that .to(device) leaves on the host; the model's checks, the
    ops' launch sizes and the loss's counts read it, never the device copy (three syncs per step before)."""
    import dataclasses

    from stfast.parallel.components import ComponentExecutor, ComponentPlan

    trips = random_trips(6, seed=3, min_len=3, max_len=20)
    vocab = DriverVocab(trips.driver)
    torch.manual_seed(0)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab), kernels=kernels), NormStats.from_trips(trips))
    b = TripDataset(trips, vocab).batch(np.arange(6))
    moved = b.to("cpu")
    assert moved.host_lengths is b.host_lengths and torch.equal(b.host_lengths, b.lengths)
    b = dataclasses.replace(b, lengths=b.lengths.as_subclass(_DeviceLengths))
    _DeviceLengths.reads.clear()
    p = loss_parts(model, model(b), b)
    p.entire_ape_sum.backward()
    assert p.n_local == int((b.host_lengths - model.cfg.kernel_size + 1).sum())
    assert _DeviceLengths.reads == []
    # the executor (its StepResult.loss is a float: the one host read a step makes, of a plain loss here)
    ComponentExecutor(ComponentPlan.concurrent(model.component_graph(), "cpu"), micro_batches=2).forward_backward(
        b, lambda out, mb: loss_parts(model, out, mb).entire_ape_sum.as_subclass(torch.Tensor))
    assert _DeviceLengths.reads == []
    with pytest.raises(ValueError, match="host_lengths must be a CPU tensor"):
        dataclasses.replace(b, host_lengths=b.host_lengths.to("meta"))
