"""Component parallelism for someone else's model: declare its forward as a ComponentGraph, place it with
a ComponentPlan, run it with the ComponentExecutor, and get the plain model's outputs and gradients.

    python examples/component_plan.py

The model (not DeepTTE): a two-layer GRU regressor over variable-length sequences with a per-sequence
context MLP. Its graph: ``encode`` (per-step projection) ∥ ``context`` → ``gru0`` → ``gru1`` → ``head``.
The plan cuts it into two pipeline stages (encode + context + gru0 | gru1 + head) on two CPU "devices",
each stage on its own worker thread, 4 GPipe micro-batches. Prints the loss of both and the largest
output and gradient differences (float64: they agree to rounding).
"""
from __future__ import annotations

import torch
from _sequences import make_sequences
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence

from stfast.parallel.components import (
    Component,
    ComponentExecutor,
    ComponentGraph,
    ComponentPlan,
)


def packed(x: torch.Tensor, lengths: torch.Tensor):
    return pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)


class ContextGRURegressor(nn.Module):
    """batch = {"x": [B, T, F] padded, "lengths": [B] int64 (CPU), "context": [B, C], "target": [B]} → [B]."""

    def __init__(self, features: int = 4, context: int = 4, hidden: int = 32):
        super().__init__()
        self.encode = nn.Linear(features, hidden)
        self.context = nn.Sequential(nn.Linear(context, hidden), nn.Tanh())
        self.gru0 = nn.GRU(hidden, hidden, batch_first=True)
        self.gru1 = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(2 * hidden, 1)

    # one method per component: forward() and the graph call the same code
    def run_encode(self, x):
        return torch.tanh(self.encode(x))

    def run_gru0(self, e, lengths):  # all steps of layer 0, padded again for layer 1
        return pad_packed_sequence(self.gru0(packed(e, lengths))[0], batch_first=True, total_length=e.shape[1])[0]

    def run_gru1(self, h0, lengths):  # layer 1's state after each sequence's last step
        return self.gru1(packed(h0, lengths))[1][-1]

    def run_head(self, h, c):
        return self.head(torch.cat([h, c], dim=-1)).squeeze(-1)

    def forward(self, batch: dict) -> torch.Tensor:
        h0 = self.run_gru0(self.run_encode(batch["x"]), batch["lengths"])
        return self.run_head(self.run_gru1(h0, batch["lengths"]), self.context(batch["context"]))

    def component_graph(self) -> ComponentGraph:
        comps = [Component("encode", self.run_encode, ("x",), ("e",), (self.encode,)),
                 Component("context", self.context, ("context",), ("c",), (self.context,)),
                 Component("gru0", self.run_gru0, ("e", "lengths"), ("h0",), (self.gru0,)),
                 Component("gru1", self.run_gru1, ("h0", "lengths"), ("h",), (self.gru1,)),
                 Component("head", self.run_head, ("h", "c"), ("y",), (self.head,))]
        return ComponentGraph(comps, sources=("x", "lengths", "context"), outputs=("y",),
                              make_inputs=lambda b: {k: b[k] for k in ("x", "lengths", "context")},
                              make_output=lambda v: v["y"])


def make_batch(n: int, seed: int = 0) -> dict:
    seqs, target = make_sequences(n, seed=seed, max_len=40)
    return {"x": pad_sequence(seqs, batch_first=True).double(), "lengths": torch.tensor([len(s) for s in seqs]),
            "context": torch.stack([s.std(0) for s in seqs]).double(), "target": target.double()}


def main() -> dict:
    torch.manual_seed(0)
    model = ContextGRURegressor().double()
    batch = make_batch(48)
    n = len(batch["target"])

    def loss_fn(y, mb):  # a SUM over the micro-batch / the whole batch's count: micro-batch losses add up
        return (y - mb["target"]).square().sum() / n

    loss = loss_fn(model(batch), batch)
    loss.backward()
    ref = {k: p.grad.clone() for k, p in model.named_parameters()}
    with torch.no_grad():
        ref_y = model(batch)
    model.zero_grad(set_to_none=True)

    plan = ComponentPlan.staged(model.component_graph(), [["encode", "context", "gru0"], ["gru1", "head"]],
                                ["cpu", "cpu"], concurrent=True)
    ex = ComponentExecutor(plan, micro_batches=4, threads=True)
    try:
        res = ex.forward_backward(batch, loss_fn)
    finally:
        ex.close()
    out_diff = (res.output - ref_y).abs().max().item()
    grad_diff = max((p.grad - ref[k]).abs().max().item() for k, p in model.named_parameters())
    print(f"plan: {plan}")
    print(f"loss plain {loss.item():.12f}   component plan {res.loss:.12f}")
    print(f"largest output difference {out_diff:.2e}, largest gradient difference {grad_diff:.2e}")
    return {"loss": (loss.item(), res.loss), "max_output_diff": out_diff, "max_grad_diff": grad_diff}


if __name__ == "__main__":
    main()
