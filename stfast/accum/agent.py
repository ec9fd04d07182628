"""The RL agent that picks the accumulation steps k each window: a neural contextual bandit — a
Q-network regressing each k's reward (one-step DQN, Mnih et al. 2015, with the discount γ = 0;
ε-greedy exploration, a replay memory) in plain PyTorch, one file in the manner of CleanRL: every
hyper-parameter named at the top, seeded end to end.

Why a bandit: the reward of a window is its log goodput gain (window.log_goodput_gain: ln of
the goodput over the k = 1 pace), and progress follows dP/dt = goodput(k, P), so taking the k of the
largest goodput at every moment maximizes the progress made by any time (the comparison principle
for a scalar ODE); what a window's k changes later — more progress, hence a larger noise scale —
the next observation shows. So the best policy is greedy in the expected per-window reward and no
credit has to travel across windows. Regressing the reward of each k (every window a labelled
example) is also more sample-efficient than a policy gradient, so pre-training takes seconds. (The
earlier PPO agent, γ = 1 over a 40-window episode, chose one constant k for every state; its offline
training also stored views of an observation array that it then overwrote, which record() now copies.)

Residual on the goodput model (residual policy learning: Silver et al. 2018, arXiv:1812.06298;
Johannink et al., ICRA 2019): the Q-network of ``pretrained_agent`` learns only a correction to
:func:`goodput_model_q`, Pollux's prediction of each k's log goodput gain read off the observation's
noise scale and per-step overhead. Its output layer starts at zero, so before any learning the agent
chooses exactly what GoodputScheduler's model predicts from the same window, and learning can only add
what the rewards support: in the simulator, where the observed noise scale is noisy, what a window's
true gain is given that estimate; live, where the step-time model's extrapolation to untried k is
wrong, the measured throughput.

Why our own ~150 lines instead of stable-baselines3: the policy must act and learn *inside* the
training loop one window at a time (record a transition, update every few windows) and travel in
the training checkpoint; SB3's learn() owns the loop and its own environment stepping.

Use: ``act(obs)`` → (action, log-probability of it under the ε-greedy policy, Q of it);
``record(...)`` one transition; ``update()`` gradient steps on the replay memory. ``train_offline``
runs the same cycle on gymnasium environments; ``pretrained_agent`` pre-trains one on the
randomized SimulatedTrainingEnv.
"""
from __future__ import annotations

import copy
import functools
import math
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from .window import (
    DEFAULT_CHOICES,
    NOISE_OBS_SCALE,
    OBS_DIM,
    OVERHEAD_OBS_SCALE,
    SWITCH_GAIN,
    AccumulationScheduler,
    WindowStats,
    log_goodput_gain,
    observation,
)

HIDDEN = 64  # units of both hidden layers of the Q-network
LR = 1e-3  # Adam step size
# ε-greedy exploration when acting non-deterministically (online, inside training). Online, an exploratory
# window tries a choice adjacent to the greedy one (k/2 or 2k), not any: a window at k = 16 takes 16 times
# as long as one at k = 1, so uniform probes spent ~15 % of a live run's budget at k ≫ best
# (runs/bench_accum_s6, Chengdu) while neighbours are where the best k moves to next.
EPSILON = 0.05
PRIOR_SHARE = 0.5  # online updates: share of each minibatch drawn from the pre-training transitions
EPSILON_OFFLINE = (1.0, 0.2)  # pre-training: ε falls linearly from the first to the second value
MINIBATCH = 128
GRAD_STEPS = 32  # minibatch steps per update offline (ROLLOUT new transitions each)
# online (RLScheduler): one minibatch step per window recorded since the last update. The update runs inside
# the training loop, on the training's core: 32 steps every 8 windows took 50–80 ms per 8 windows, ~3 % of a
# live Chengdu run's wall time (benchmarks/accumulation.py --live: rl's overhead 26 ms a step, goodput's 22 ms)
ONLINE_STEPS_PER_WINDOW = 1
REPLAY = 20_000  # transitions kept (the oldest are dropped)
MAX_GRAD_NORM = 1.0
ROLLOUT = 256  # transitions per update when training offline
PARALLEL_ENVS = 16  # simulated environments stepped side by side offline (one batched act)
PRETRAIN_STEPS = 16_000  # offline pre-training transitions (about 8 s on one core of this VM; the residual
# network from 8,000 reached 0.973–0.985 of the optimal return on the simulated cluster, from 16,000 0.987–0.992,
# seeds 0–3; the goodput model alone 0.994)


def _mlp(n_in: int, n_out: int, zero_output: bool = False) -> nn.Sequential:
    layers = [nn.Linear(n_in, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, n_out)]
    for layer in layers:
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, 0.1 if layer is layers[-1] else np.sqrt(2))
            nn.init.zeros_(layer.bias)
    if zero_output:  # a residual starts at 0 (its gradient still flows: the hidden activations are not 0)
        nn.init.zeros_(layers[-1].weight)
    return nn.Sequential(*layers)


def goodput_model_q(obs: torch.Tensor, choices=DEFAULT_CHOICES) -> torch.Tensor:
    """Pollux's predicted log goodput gain ln(goodput(k) / goodput(1)) [N, len(choices)] for observations
    obs [N, OBS_DIM] (window.observation), from their first two entries alone: the noise scale over
    the micro-batch, φ/B = 2^(8·o₀), and the per-step overhead over a micro-step's compute,
    r = t_fixed/t_micro = 2^(6·o₁). With step time k·t_micro + t_fixed and E(kB) = (φ + B)/(φ + kB):

        ln(goodput(k)/goodput(1)) = ln(k(1 + r)/(k + r)) + ln((φ/B + 1)/(φ/B + k))

    An unknown noise scale (o₀ = 0) reads as φ = B; the clipping of o₀, o₁ to [−1, 1] bounds φ/B and r
    to [2⁻⁸, 2⁸] and [2⁻⁶, 2⁶]."""
    obs = torch.as_tensor(obs, dtype=torch.float32).reshape(-1, OBS_DIM)
    k = torch.as_tensor(choices, dtype=torch.float32)
    phi = torch.exp2(NOISE_OBS_SCALE * obs[:, :1])
    r = torch.exp2(OVERHEAD_OBS_SCALE * obs[:, 1:2])
    return torch.log(k * (1 + r) / (k + r)) + torch.log((phi + 1) / (phi + k))


def _stack(transitions: list[tuple]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(obs [N, obs_dim] float32, action [N] int64, reward [N] float32) of (obs, action, reward) tuples."""
    return (torch.as_tensor(np.stack([t[0] for t in transitions])), torch.as_tensor([t[1] for t in transitions]),
            torch.as_tensor([t[2] for t in transitions], dtype=torch.float32))


class Agent:
    """Contextual-bandit Q-network for a discrete action (index into the k choices) from an
    observation [OBS_DIM] float32 in [-1, 1]: Q(obs) [n_actions] estimates each action's reward.
    ``base_q`` (optional, obs [N, obs_dim] → [N, n_actions], e.g. a functools.partial of
    :func:`goodput_model_q`): a model's prediction that the network corrects, Q = base_q + network,
    the network's output starting at 0. All randomness (init, exploration, minibatches) from ``seed``."""

    def __init__(self, n_actions: int, obs_dim: int = OBS_DIM, seed: int = 0, base_q=None):
        if n_actions < 1:
            raise ValueError(f"n_actions must be ≥ 1, got {n_actions}")
        self.n_actions, self.obs_dim, self.base_q = n_actions, obs_dim, base_q
        self.gen = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.q = _mlp(obs_dim, n_actions, zero_output=base_q is not None)
        self.opt = torch.optim.Adam(self.q.parameters(), lr=LR)
        self.epsilon = EPSILON
        self.adjacent = True  # exploration to adjacent actions (online); False: uniform (pre-training)
        self.replay: list[tuple] = []  # (obs, action, reward)
        self.n_recorded = 0  # transitions recorded since the last update
        # pre-training transitions (obs [N, obs_dim] float32, action [N] int64, reward [N] float32) mixed into
        # online updates, so a few dozen live windows refine the Q-network where training goes without
        # overwriting what it learned about the states it has not visited (empty: no anchor)
        self.prior = (torch.zeros(0, obs_dim), torch.zeros(0, dtype=torch.long), torch.zeros(0))

    def values(self, obs: torch.Tensor) -> torch.Tensor:
        """Q [N, n_actions] of observations [N, obs_dim] float32: the network, plus base_q when given."""
        q = self.q(obs)
        return q if self.base_q is None else q + self.base_q(obs)

    def _rand(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self.gen, dtype=torch.float64)

    @torch.no_grad()
    def act_batch(self, obs: np.ndarray, deterministic: bool = False, current=None,
                  margin: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Actions [N] int, their log-probabilities [N] under the ε-greedy policy and Q values [N] for
        observations [N, obs_dim]. The greedy action is argmax Q, except that ``current`` (action
        indices [N], optional) is kept while its Q is within ``margin`` of the largest. deterministic:
        the greedy action. Exploration (probability ε) picks an adjacent action (index ±1, each half)
        when ``adjacent``, else a uniform one."""
        x = torch.as_tensor(np.asarray(obs, np.float32)).reshape(-1, self.obs_dim)
        q = self.values(x)
        greedy = q.argmax(-1)
        if current is not None:
            cur = torch.as_tensor(np.asarray(current, np.int64)).reshape(-1).expand(len(x))
            stay = q.gather(1, cur[:, None])[:, 0] >= q.gather(1, greedy[:, None])[:, 0] - margin
            greedy = torch.where(stay, cur, greedy)
        eps = 0.0 if deterministic else self.epsilon
        explore = self._rand(len(x)) < eps
        if self.adjacent and self.n_actions > 1:
            edge = (greedy == 0) | (greedy == self.n_actions - 1)
            step = torch.where(self._rand(len(x)) < 0.5, -1, 1)
            step = torch.where(greedy == 0, 1, torch.where(greedy == self.n_actions - 1, -1, step))
            a = torch.where(explore, greedy + step, greedy)
            # an inner greedy action's two neighbours are explored with ε/2 each, an edge's one with ε
            p = torch.where(a == greedy, 1.0 - eps, eps * torch.where(edge, 1.0, 0.5)).double()
        else:
            rand = torch.randint(self.n_actions, (len(x),), generator=self.gen)
            a = torch.where(explore, rand, greedy)
            p = eps / self.n_actions + (1 - eps) * (a == greedy).double()
        return a.numpy(), np.log(p.numpy()), q.gather(1, a[:, None])[:, 0].numpy()

    def act(self, obs: np.ndarray, deterministic: bool = False, current: int | None = None,
            margin: float = 0.0) -> tuple[int, float, float]:
        """ε-greedy (or, deterministic, greedy) action for ``obs`` [obs_dim]: (action, log-probability, Q).
        current / margin: see act_batch."""
        a, lp, v = self.act_batch(obs, deterministic, None if current is None else [current], margin)
        return int(a[0]), float(lp[0]), float(v[0])

    def record(self, obs, action: int, reward: float) -> None:
        """One transition: the window after ``obs`` [obs_dim] ran ``action`` and earned ``reward``. A bandit
        (γ = 0) needs no next observation or episode end. Raises ValueError for an action out of range or a
        non-finite reward."""
        if not 0 <= int(action) < self.n_actions:
            raise ValueError(f"action must be in 0..{self.n_actions - 1}, got {action!r}")
        if not math.isfinite(reward):
            raise ValueError(f"reward must be finite, got {reward!r}")
        # a copy: callers (train_offline) reuse their observation arrays in place
        self.replay.append((np.array(obs, np.float32), int(action), float(reward)))
        if len(self.replay) > REPLAY:
            del self.replay[: len(self.replay) - REPLAY]
        self.n_recorded += 1

    def update(self, steps: int = GRAD_STEPS) -> dict:
        """``steps`` minibatch steps of the squared error of Q(obs, action) to the reward, on
        minibatches drawn from the replay memory and, a PRIOR_SHARE of each, from the pre-training
        transitions (``prior``, when present). Returns the last minibatch's loss."""
        self.n_recorded = 0
        if not self.replay:
            return {}
        obs, act, rew = _stack(self.replay)
        p_obs, p_act, p_rew = self.prior
        n_prior = round(PRIOR_SHARE * MINIBATCH) if len(p_rew) else 0
        loss = torch.zeros(())
        for _ in range(steps):
            i = torch.randint(len(rew), (min(MINIBATCH - n_prior, len(rew)),), generator=self.gen)
            j = torch.randint(max(len(p_rew), 1), (n_prior,), generator=self.gen)
            o, a, r = torch.cat([obs[i], p_obs[j]]), torch.cat([act[i], p_act[j]]), torch.cat([rew[i], p_rew[j]])
            q = self.values(o).gather(1, a[:, None])[:, 0]
            loss = (q - r).square().mean()
            self.opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(self.q.parameters(), MAX_GRAD_NORM)
            self.opt.step()
        return {"q_loss": loss.item()}

    def state_dict(self) -> dict:
        return {"q": self.q.state_dict(), "opt": self.opt.state_dict(), "gen": self.gen.get_state(),
                "replay": list(self.replay), "n_recorded": self.n_recorded, "epsilon": self.epsilon,
                "n_actions": self.n_actions, "prior": self.prior}

    def load_state_dict(self, s: dict) -> None:
        if s["n_actions"] != self.n_actions:
            raise ValueError(f"checkpoint agent has {s['n_actions']} actions, this one {self.n_actions}")
        self.q.load_state_dict(s["q"])
        self.opt.load_state_dict(s["opt"])
        self.gen.set_state(s["gen"])
        self.replay, self.n_recorded, self.epsilon = list(s["replay"]), s["n_recorded"], s["epsilon"]
        if "prior" in s:  # absent in checkpoints before 2026-11-30 (no anchor then)
            self.prior = s["prior"]


def train_offline(agent: Agent, envs: list, steps: int, seed: int = 0, learn_from: str | None = "log_goodput_gain") -> list[float]:
    """Train ``agent`` on gymnasium environments ``envs`` (stepped side by side, one batched act) for
    ``steps`` transitions in all, ε falling over EPSILON_OFFLINE, an update every ROLLOUT; returns
    the finished episodes' returns (of the environments' rewards). The agent learns from
    ``info[learn_from]`` of each step (the log goodput gain), or from the reward when ``learn_from`` is
    None. The agent's online ε is restored afterwards."""
    eps_online, adjacent_online = agent.epsilon, agent.adjacent
    agent.adjacent = False  # uniform exploration covers every (state, k) pair the simulator can reach
    obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)])
    returns, ep_ret = [], np.zeros(len(envs))
    since = 0
    for done in range(0, steps, len(envs)):
        agent.epsilon = EPSILON_OFFLINE[0] + (EPSILON_OFFLINE[1] - EPSILON_OFFLINE[0]) * done / steps
        acts = agent.act_batch(obs)[0]
        for i, e in enumerate(envs):
            nxt, r, term, trunc, info = e.step(int(acts[i]))
            ep_ret[i] += r
            agent.record(obs[i], int(acts[i]), r if learn_from is None else info[learn_from])
            if term or trunc:
                returns.append(ep_ret[i])
                ep_ret[i] = 0.0
                nxt, _ = e.reset()
            obs[i] = nxt
        since += len(envs)
        if since >= ROLLOUT:
            agent.update()
            since = 0
    agent.epsilon, agent.adjacent = eps_online, adjacent_online
    return returns


def residual_agent(choices: tuple, seed: int) -> Agent:
    """An untrained agent whose Q is goodput_model_q for ``choices`` plus a residual network starting at 0."""
    return Agent(len(choices), seed=seed, base_q=functools.partial(goodput_model_q, choices=choices))


@functools.lru_cache(maxsize=4)
def _pretrained_state(choices: tuple, seed: int, steps: int) -> dict:
    from .env import SimulatedTrainingEnv, default_sim_config
    from .profile import NoiseCalibration

    base = default_sim_config()
    calibration = NoiseCalibration.load()  # the live estimate's measured bias (None: unbiased)
    envs = [SimulatedTrainingEnv(base, choices, randomize=True, calibration=calibration) for _ in range(PARALLEL_ENVS)]
    agent = residual_agent(choices, seed)
    train_offline(agent, envs, steps, seed=seed)
    # the pre-training transitions become the anchor of online updates; the replay holds only live ones
    agent.prior = _stack(agent.replay)
    agent.replay, agent.n_recorded = [], 0
    return copy.deepcopy(agent.state_dict())


def pretrained_agent(choices=DEFAULT_CHOICES, seed: int = 0, steps: int = PRETRAIN_STEPS) -> Agent:
    """An agent for accumulation steps ``choices`` whose Q is :func:`goodput_model_q` plus a residual
    network pre-trained offline on SimulatedTrainingEnv with randomized communication share, noise scale
    and its growth, and the live noise-scale estimate's bias at k = 1 and its growth with k over the ranges
    measured live (randomized_config with the profile's NoiseCalibration), seeded; cached per process."""
    choices = tuple(int(k) for k in choices)
    agent = residual_agent(choices, seed)
    agent.load_state_dict(copy.deepcopy(_pretrained_state(choices, seed, steps)))
    return agent


class RLScheduler(AccumulationScheduler):
    """A policy network (stfast.accum.agent) picks k from ``choices`` every window; the reward of
    each window (its log goodput gain, see :func:`log_goodput_gain`) is fed back and the agent is fine-tuned online every
    ``update_every`` windows, one minibatch step per window (agent.ONLINE_STEPS_PER_WINDOW; ``online=False``:
    act only). Like GoodputScheduler it keeps its first k (``k0``, --accum-start) until a noise scale is
    measured, and then keeps the current k unless another's predicted gain is 5 % larger (SWITCH_GAIN, on
    the log scale of its Q values), so noise in the observed noise scale does not make k oscillate; exploration tries k/2 or 2k.

    An exploratory window is a one-window probe: the margin protects the last *greedy* choice
    (``k_greedy``), so after a probe the next window returns to it unless the agent's Q now prefers another k
    by the margin. (Protecting whatever k ran last turned probes into stays: on the Chengdu sample, where the
    predicted gains of k = 2…8 differ by less than the margin, a probe to 8 or 2 held for 3–10 windows;
    docs/accumulation.md, "The schedulers".)"""

    def __init__(self, agent, choices=DEFAULT_CHOICES, k0: int = 1, online: bool = True, update_every: int = 8):
        super().__init__(choices, k0)
        if agent.n_actions != len(self.choices):
            raise ValueError(f"agent has {agent.n_actions} actions, choices are {self.choices}")
        self.agent = agent
        self.online = online
        self.update_every = update_every
        self._pending = None  # (obs, action) of the decision whose window just ran
        self.last_reward = math.nan
        self.noise_scale = math.nan  # the last finite noise-scale estimate
        self.k_greedy = k0  # the last greedy choice: what the margin protects (an exploratory k is not)

    def observe(self, stats: WindowStats) -> int:
        if not (math.isfinite(stats.noise_scale) or math.isfinite(self.noise_scale)):
            # no estimate yet (Adam's warm-up, the estimator's first steps): keep k, as GoodputScheduler does.
            # The observation would read the unknown scale as φ = B, where k = 1 is best: a run started at
            # --accum-start 4 fell to k = 1 after its first window (docs/accumulation.md, "The schedulers")
            return self.k
        # a window without a finite estimate keeps the last one, for the observation and the reward alike
        # (as GoodputScheduler does): an unknown noise scale must not read as "large batches are free"
        if math.isfinite(stats.noise_scale):
            self.noise_scale = stats.noise_scale
        elif math.isfinite(self.noise_scale):
            stats = replace(stats, noise_scale=self.noise_scale)
        # observation and reward against the k = 1 pace this same window implies, not a fixed first window's:
        # the machine's speed drifts (docs/accumulation.md, "The schedulers") and would read as a gain or loss of
        # the k it ran
        obs = observation(stats, None, self.choices)
        if self._pending is not None and self.online:
            self.last_reward = log_goodput_gain(stats)
            self.agent.record(*self._pending, self.last_reward)
            if self.agent.n_recorded >= self.update_every:
                self.agent.update(ONLINE_STEPS_PER_WINDOW * self.agent.n_recorded)
        current, margin = self.choices.index(self.k_greedy), math.log1p(SWITCH_GAIN)
        self.k_greedy = self.choices[self.agent.act(obs, deterministic=True, current=current, margin=margin)[0]]
        action = self.agent.act(obs, current=current, margin=margin)[0]  # ε-greedy around the same greedy k
        self._pending = (obs, action)
        self.k = self.choices[action]
        return self.k

    def state_dict(self) -> dict:
        return {"k": self.k, "agent": self.agent.state_dict(), "pending": self._pending,
                "noise_scale": self.noise_scale, "k_greedy": self.k_greedy}

    def load_state_dict(self, s: dict) -> None:
        self.k, self.noise_scale = s["k"], s["noise_scale"]  # "ref" of checkpoints before 2026-12-02: unused now
        self.k_greedy = s.get("k_greedy", self.k)  # checkpoints before 2026-12-01 night: the last k was protected
        # (obs, action); checkpoints before 2026-12-01 held the removed PPO agent's log-probability and value too
        self._pending = None if s["pending"] is None else tuple(s["pending"][:2])
        self.agent.load_state_dict(s["agent"])
