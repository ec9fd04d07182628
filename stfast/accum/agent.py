"""A small PPO agent (Schulman et al. 2017, clipped surrogate; GAE, Schulman et al. 2016) in plain
PyTorch, one file in the manner of CleanRL: every hyper-parameter named at the top, seeded end to end.

Why our own ~150 lines instead of stable-baselines3: the policy must act and learn *inside* the
training loop one window at a time (record a transition, update every few windows) and travel in
the training checkpoint; SB3's learn() owns the loop and its own environment stepping, which fits
offline pre-training but not online fine-tuning driven by the trainer.

Use: ``act(obs)`` → (action, log-prob, value); ``record(...)`` one transition; ``update()`` a PPO
update on the recorded transitions (then cleared). ``train_offline`` runs the same cycle on a
gymnasium environment; ``pretrained_agent`` pre-trains one on the randomized SimulatedTrainingEnv.
"""
from __future__ import annotations

import copy
import functools

import numpy as np
import torch
from torch import nn

from .schedulers import OBS_DIM

HIDDEN = 64  # units of both hidden layers (policy and value networks)
LR = 1e-3  # Adam step size
GAMMA = 1.0  # no discount: the return over the wall budget is the progress (see schedulers.reward)
GAE_LAMBDA = 0.95
CLIP = 0.2  # PPO ratio clip
EPOCHS = 4  # passes over a rollout per update
MINIBATCH = 64
ENT_COEF = 0.01  # entropy bonus (exploration)
VF_COEF = 0.5
MAX_GRAD_NORM = 0.5
REWARD_SCALE = 0.2  # rewards are multiplied by this before learning (keeps returns O(1) for the critic)
ROLLOUT = 256  # transitions per update when training offline
PARALLEL_ENVS = 16  # simulated environments stepped side by side offline (one batched act)
PRETRAIN_STEPS = 12_000  # offline pre-training transitions (about 10–25 s on one shared core)


def _mlp(n_in: int, n_out: int, out_gain: float) -> nn.Sequential:
    layers = [nn.Linear(n_in, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, n_out)]
    for layer in layers:
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, out_gain if layer is layers[-1] else np.sqrt(2))
            nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class Agent:
    """PPO actor-critic for a discrete action (index into the k choices) from an observation
    [OBS_DIM] float32 in [-1, 1]. All randomness (init, sampling, minibatches) from ``seed``."""

    def __init__(self, n_actions: int, obs_dim: int = OBS_DIM, seed: int = 0):
        self.n_actions, self.obs_dim = n_actions, obs_dim
        self.gen = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.actor = _mlp(obs_dim, n_actions, 0.01)
            self.critic = _mlp(obs_dim, 1, 1.0)
        self.opt = torch.optim.Adam([*self.actor.parameters(), *self.critic.parameters()], lr=LR, eps=1e-5)
        self.buffer: list[tuple] = []

    @property
    def n_recorded(self) -> int:
        return len(self.buffer)

    @torch.no_grad()
    def act_batch(self, obs: np.ndarray, deterministic: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Actions [N] int, their log-probabilities [N] and values [N] for observations [N, obs_dim]."""
        x = torch.as_tensor(np.asarray(obs, np.float32)).reshape(-1, self.obs_dim)
        logp = torch.log_softmax(self.actor(x), -1)
        if deterministic:
            a = logp.argmax(-1)
        else:
            a = torch.multinomial(logp.exp(), 1, generator=self.gen)[:, 0]
        return a.numpy(), logp.gather(1, a[:, None])[:, 0].numpy(), self.critic(x)[:, 0].numpy()

    def act(self, obs: np.ndarray, deterministic: bool = False) -> tuple[int, float, float]:
        """Sample (or, deterministic, take the most likely) action for ``obs`` [obs_dim]:
        (action, log-probability, value)."""
        a, lp, v = self.act_batch(obs, deterministic)
        return int(a[0]), float(lp[0]), float(v[0])

    def record(self, obs, action: int, logp: float, value: float, reward: float, next_obs, terminated: bool,
               truncated: bool = False) -> None:
        """One transition (the value and log-prob as returned by act when the action was taken).
        terminated: no value after it; truncated: the episode was cut (its value is bootstrapped
        from next_obs, but the advantage chain ends)."""
        self.buffer.append((np.asarray(obs, np.float32), action, logp, value, REWARD_SCALE * float(reward),
                            np.asarray(next_obs, np.float32), bool(terminated), bool(terminated or truncated)))

    def update(self) -> dict:
        """A PPO update on the recorded transitions (in order, one or more episodes), then clear them.
        Returns the last minibatch's losses."""
        obs, act, logp, val, rew, nxt, term, end = (np.array(x) for x in zip(*self.buffer))
        self.buffer = []
        with torch.no_grad():
            next_v = self.critic(torch.as_tensor(nxt)).squeeze(-1).numpy()
        adv = np.zeros(len(rew), np.float32)
        last = 0.0
        for t in reversed(range(len(rew))):  # GAE; the chain runs to the next transition within an episode
            cont = 0.0 if end[t] or t + 1 == len(rew) else 1.0
            delta = rew[t] + GAMMA * next_v[t] * (0.0 if term[t] else 1.0) - val[t]
            last = delta + GAMMA * GAE_LAMBDA * cont * last
            adv[t] = last
        ret = adv + val
        obs_t, act_t = torch.as_tensor(obs), torch.as_tensor(act, dtype=torch.long)
        logp_t, adv_t, ret_t = (torch.as_tensor(x, dtype=torch.float32) for x in (logp, adv, ret))
        stats = {}
        for _ in range(EPOCHS):
            perm = torch.randperm(len(rew), generator=self.gen)
            for s in range(0, len(rew), MINIBATCH):
                i = perm[s:s + MINIBATCH]
                a = adv_t[i]
                a = (a - a.mean()) / (a.std() + 1e-8) if len(i) > 1 else a
                dist = torch.distributions.Categorical(logits=self.actor(obs_t[i]))
                ratio = torch.exp(dist.log_prob(act_t[i]) - logp_t[i])
                pg = torch.max(-a * ratio, -a * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
                vf = (self.critic(obs_t[i]).squeeze(-1) - ret_t[i]).square().mean()
                ent = dist.entropy().mean()
                loss = pg + VF_COEF * vf - ENT_COEF * ent
                self.opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_([*self.actor.parameters(), *self.critic.parameters()], MAX_GRAD_NORM)
                self.opt.step()
                stats = {"policy_loss": pg.item(), "value_loss": vf.item(), "entropy": ent.item()}
        return stats

    def state_dict(self) -> dict:
        return {"actor": self.actor.state_dict(), "critic": self.critic.state_dict(), "opt": self.opt.state_dict(),
                "gen": self.gen.get_state(), "buffer": list(self.buffer), "n_actions": self.n_actions}

    def load_state_dict(self, s: dict) -> None:
        if s["n_actions"] != self.n_actions:
            raise ValueError(f"checkpoint agent has {s['n_actions']} actions, this one {self.n_actions}")
        self.actor.load_state_dict(s["actor"])
        self.critic.load_state_dict(s["critic"])
        self.opt.load_state_dict(s["opt"])
        self.gen.set_state(s["gen"])
        self.buffer = list(s["buffer"])


def train_offline(agent: Agent, envs: list, steps: int, seed: int = 0) -> list[float]:
    """Train ``agent`` on gymnasium environments ``envs`` (stepped side by side, one batched act) for
    ``steps`` transitions in all, a PPO update every ROLLOUT; returns the finished episodes' returns."""
    obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)])
    bufs: list[list] = [[] for _ in envs]
    returns, ep_ret = [], np.zeros(len(envs))
    for _ in range(0, steps, len(envs)):
        acts, logps, vals = agent.act_batch(obs)
        for i, e in enumerate(envs):
            nxt, r, term, trunc, _ = e.step(int(acts[i]))
            ep_ret[i] += r
            bufs[i].append((obs[i], int(acts[i]), float(logps[i]), float(vals[i]), r, nxt, term, trunc))
            if term or trunc:
                returns.append(ep_ret[i])
                ep_ret[i] = 0.0
                nxt, _ = e.reset()
            obs[i] = nxt
        if sum(map(len, bufs)) >= ROLLOUT:
            for b in bufs:  # each environment's segment in order; its last transition ends the GAE chain
                for j, tr in enumerate(b):
                    agent.record(*tr[:7], tr[7] or j == len(b) - 1)
            bufs = [[] for _ in envs]
            agent.update()
    return returns


@functools.lru_cache(maxsize=4)
def _pretrained_state(n_actions: int, seed: int, steps: int) -> dict:
    from .env import SimConfig, SimulatedTrainingEnv
    from .profile import ComputeProfile

    base = SimConfig.from_profile(ComputeProfile.load(), ranks=2, micro_batch=64)
    envs = [SimulatedTrainingEnv(base, randomize=True) for _ in range(PARALLEL_ENVS)]
    agent = Agent(n_actions, seed=seed)
    train_offline(agent, envs, steps, seed=seed)
    agent.buffer = []
    return copy.deepcopy(agent.state_dict())


def pretrained_agent(n_actions: int, seed: int = 0, steps: int = PRETRAIN_STEPS) -> Agent:
    """An agent pre-trained offline on SimulatedTrainingEnv with randomized communication share,
    noise scale and its growth (randomized_config), seeded; cached per process."""
    agent = Agent(n_actions, seed=seed)
    agent.load_state_dict(copy.deepcopy(_pretrained_state(n_actions, seed, steps)))
    return agent
