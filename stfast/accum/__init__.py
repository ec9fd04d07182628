"""Gradient accumulation whose step count k a scheduler chooses: the gradient noise scale (noise),
goodput and the LR rule (goodput), schedulers (Fixed, Goodput, RL), gymnasium environments (env),
the RL agent (agent) and the trainer-side controller (controller)."""
