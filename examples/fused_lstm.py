"""stfast.nn.LSTM as a drop-in for torch.nn.LSTM in someone else's model (here a sequence regressor).

    python examples/fused_lstm.py

Same constructor, parameter names and return types: the state dict moves between the two unchanged, and
PackedSequence input (variable-length sequences) works as with torch. Prints both models' loss and the
largest gradient difference, then the forward+backward time of each.
"""
from __future__ import annotations

import time

import torch
from _sequences import SeqRegressor, make_sequences

import stfast.nn


def step(model, seqs, target):
    model.zero_grad(set_to_none=True)
    loss = (model(seqs) - target).square().mean()
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def main() -> dict:
    torch.manual_seed(0)
    seqs, target = make_sequences(256, max_len=120, features=8)
    ours = SeqRegressor(8, 64, num_layers=2, rnn=stfast.nn.LSTM)
    theirs = SeqRegressor(8, 64, num_layers=2, rnn=torch.nn.LSTM)
    theirs.load_state_dict(ours.state_dict())  # same names, same shapes: no conversion
    loss_a, grads_a = step(ours, seqs, target)
    loss_b, grads_b = step(theirs, seqs, target)
    worst = max((grads_a[n] - grads_b[n]).abs().max().item() / grads_b[n].abs().max().item() for n in grads_a)
    print(f"loss stfast.nn.LSTM {loss_a:.6f}   torch.nn.LSTM {loss_b:.6f}   largest relative gradient difference {worst:.2e}")
    times = {}
    for name, model in (("stfast.nn.LSTM", ours), ("torch.nn.LSTM", theirs)):
        t0 = time.perf_counter()
        for _ in range(3):
            step(model, seqs, target)
        times[name] = (time.perf_counter() - t0) / 3
        print(f"{name:15s} forward+backward {1000 * times[name]:8.1f} ms (B = 256, 2 layers, H = 64, packed)")
    return {"loss": (loss_a, loss_b), "max_rel_grad_diff": worst, "seconds": times}


if __name__ == "__main__":
    main()
