"""APPLE: each client learns a directed mixture of every client's core model.

Luo, Wu, "Adapt to Adaptation: Learning Personalization for Cross-Silo Federated
Learning", IJCAI 2022, https://arxiv.org/abs/2110.08394 -- Algorithm 1, and the authors'
code (ljaiverson/pFL-APPLE, train_APPLE.py, utils/apple.py, utils/losses.py).

Every client i keeps a core model c_i (on the server, shared) and a directed relationship
vector p_i in R^n (its own). Its personal model is theta_i = sum_j p_ij c_j. Each round a
sampled client downloads the cores and takes ``local_steps`` SGD steps on

    L_i(theta_i) + mu(t) ||p_i - p^0||^2

in its own core c_i and in p_i (the other cores frozen): with g the minibatch gradient at
theta_i, c_i moves along p_ii g (step ``lr``) and p_ij along <g, c_j> + 2 mu(t)(p_ij -
p^0_j) (step ``p_lr``); it uploads c_i. p^0 are the clients' shares of the training
samples (every p_i starts there); mu(t) decays from ``mu`` to 0 over the first
``mu_rounds`` share of the rounds: exponentially (mu 0.001^(t / T_mu), the code's default)
or along a half cosine, and is 0 afterwards.

Readings chosen: the cores start from independent initialisations, as the code's (one
network built per client); the steps are plain SGD where the code uses momentum 0.9 with
step sizes 0.01 (cores) and 0.001 (p): ``lr`` 0.1 and ``p_lr`` 0.01 are those steps'
size with the momentum's 1 / (1 - 0.9) folded in. P (the rows p_i) is the method's
collaboration matrix.

Bandwidth. By default every sampled client downloads every core each round (the code's
default), and a personal model mixes the latest cores. The code's limited-bandwidth mode
(``downloads``: M, its ``limit_downloaded_models``; utils/apple.py ``get_download_which``)
has each client keep the copy of every core it last downloaded and, from round 1 on,
download M of the others' cores a round: the ones it has never downloaded first (a
random M of them), the rest of the M drawn without replacement with probabilities
proportional to base^|p_ij|, base = max(``download_base``, t M / n ``download_growth``)
(the code's ``thresh`` 1.5 and ``lamb`` 1), so that the more a core weighs in p_i the
more often it is fresh. Its personal model mixes those copies, its own core always
current. Reading chosen: the code never marks a core as downloaded (its
``downloaded_once`` stays the identity), so it draws the M uniformly among the others
every round and its base^|p_ij| draw is never reached; here a download marks the core,
as the mask's name and the draw say. Round 0's cores are every client's (the code: all
downloaded at round 0, "equivalent to assigning the same set of initial core models
... by setting seeds"). The mode holds each client's copies: n^2 models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field, model_validator

from raycobo import rng
from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.common import FLOAT, sample_clients
from raycobo.algorithms.settings import ClientSampling, LocalTraining, MethodConfig

FLOOR = 0.001  # the exponential schedule's mu(T_mu) / mu (the code's epsilon)
BASE, GROWTH = 1.5, 1.0  # the limited-bandwidth draw's base: the code's thresh and lamb


class APPLEConfig(LocalTraining, ClientSampling, MethodConfig):
    """APPLE (Luo and Wu 2022): personal models as learned mixtures of all clients'
    core models."""

    name: Literal["apple"] = "apple"
    p_lr: float = Field(default=0.01, gt=0, description="the relationship vectors' step size")
    mu: float = Field(default=0.1, ge=0, description="mu: the pull of p_i toward p^0 at round 0")
    mu_rounds: float = Field(
        default=0.1, gt=0, le=1, description="the share of the rounds over which mu decays to 0"
    )
    mu_schedule: Literal["exponential", "cosine"] = Field(
        default="exponential", description="how mu decays: mu 0.001^(t / T_mu), or a half cosine"
    )
    downloads: int | None = Field(
        default=None,
        ge=1,
        description="M: the others' cores a client downloads a round, mixing the copies it "
        "holds (null: all of them every round)",
    )
    download_base: float | None = Field(
        default=None,
        gt=1,
        description="the least base of the download draw's weights base^|p_ij| (null: 1.5; "
        "only with downloads)",
    )
    download_growth: float | None = Field(
        default=None,
        ge=0,
        description="the base's growth: max(download_base, t M / n growth) (null: 1.0; only "
        "with downloads)",
    )

    @model_validator(mode="after")
    def _draw_keys_need_downloads(self) -> APPLEConfig:
        if self.downloads is None:
            for key in ("download_base", "download_growth"):
                if getattr(self, key) is not None:
                    raise ValueError(
                        f"{key}: without downloads every core is downloaded and it does "
                        "nothing: drop it or set downloads"
                    )
        return self

    def effective(self) -> dict:
        """The settings with the download draw's nulls written out where they apply."""
        out = self.model_dump(mode="json")
        if self.downloads is not None:
            out["download_base"] = draw_base(self)
            out["download_growth"] = draw_growth(self)
        return out


def draw_base(cfg: APPLEConfig) -> float:
    return BASE if cfg.download_base is None else cfg.download_base


def draw_growth(cfg: APPLEConfig) -> float:
    return GROWTH if cfg.download_growth is None else cfg.download_growth


def mu_at(cfg: APPLEConfig, rounds: int, t: int) -> float:
    """mu(t): from ``mu`` at round 0 down to 0 over the first ``mu_rounds`` share."""
    span = int(rounds * cfg.mu_rounds)
    if cfg.mu == 0 or t >= span:
        return 0.0
    if cfg.mu_schedule == "cosine":
        return (math.cos(math.pi * t / span) + 1.0) / 2.0 * cfg.mu
    return FLOOR ** (t / span) * cfg.mu


@dataclass
class APPLEState:
    C: torch.Tensor  # (n, d) the clients' core models
    P: torch.Tensor  # (n, n) the directed relationship vectors, row i client i's
    p0: torch.Tensor  # (n,) the clients' sample shares
    # with ``downloads``: (n, n, d) client i's copy of core j as it last downloaded it
    # (its own core current), and (n, n) whether it ever downloaded core j; else None
    held: torch.Tensor | None = None
    seen: torch.Tensor | None = None


def mix(p: torch.Tensor, cores: torch.Tensor) -> torch.Tensor:
    """sum_j p_ij c_j: p (m, n); cores (n, d) shared by every row, or (m, n, d) a row's own
    copies -> (m, d)"""
    return p @ cores if cores.dim() == 2 else torch.einsum("mj,mjd->md", p, cores)


def inner(G: torch.Tensor, cores: torch.Tensor) -> torch.Tensor:
    """<g_i, c_j>: G (m, d); cores as in :func:`mix` -> (m, n)"""
    return G @ cores.T if cores.dim() == 2 else torch.einsum("md,mjd->mj", G, cores)


def pick_downloads(
    P: torch.Tensor,
    seen: torch.Tensor,
    clients: torch.Tensor,
    count: int,
    base: float,
    seed: int,
    t: int,
) -> torch.Tensor:
    """The cores each client of ``clients`` (m,) downloads at round t: ``count`` of the
    others' (all where fewer), first a random choice among those it never downloaded,
    then drawn without replacement with probabilities proportional to base^|p_ij|
    (Efraimidis-Spirakis keys log(u) / weight). -> (m, n) bool"""
    m, n, ids = clients.numel(), P.shape[0], clients.cpu()
    u = rng.uniform(seed, rng.SAMPLER, t, ids[:, None], torch.arange(n), 0xA9)  # (m, n)
    weight = float(base) ** P[clients].abs().cpu().to(torch.float64)
    key = torch.where(seen[clients].cpu(), u.log() / weight, 1.0 + u)  # never seen: first
    key[torch.arange(m), ids] = float("-inf")  # its own core is never downloaded
    chosen = torch.zeros(m, n, dtype=torch.bool)
    chosen.scatter_(1, key.topk(min(count, n - 1), dim=1).indices, True)
    return chosen.to(P.device)


def local_steps(
    ops, clients, cores, C, P, p0, cfg: APPLEConfig, mu: float, t: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampled clients' steps on their own cores and relationship vectors, the other
    cores frozen: ``cores`` the ones they mix (see :func:`mix`), C (n, d) the current.
    -> (cores (m, d), rows of P (m, n), the first step's losses (m,))"""
    m = clients.numel()
    own = torch.arange(m, device=C.device)
    c, p = C[clients].clone(), P[clients].clone()
    first = None
    for s in range(cfg.local_steps):
        theta = mix(p, cores) + p[own, clients, None] * (c - C[clients])  # own core as it is
        G, losses = ops.grads(clients, theta, t, rng.STEP, s)
        G = G.to(C.dtype)
        grad_p = inner(G, cores)  # <g, c_j>, the own column corrected below
        grad_p[own, clients] = (G * c).sum(1)
        grad_p += 2.0 * mu * (p - p0)
        c = c - cfg.lr * p[own, clients, None] * G
        p = p - cfg.p_lr * grad_p
        first = losses if first is None else first
    return c, p, first


class APPLE:
    name = "apple"

    def __init__(self, cfg: APPLEConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    def init(self, ops: ClientOps) -> APPLEState:
        n = ops.n_clients
        C = torch.stack([ops.random_params(i) for i in range(n)])  # one network per client
        sizes = ops.data_sizes().to(C.dtype)
        p0 = sizes / sizes.sum()
        state = APPLEState(C, p0.expand(n, -1).clone(), p0)
        if self.cfg.downloads is not None and self.cfg.downloads < n - 1:
            state.held = C.expand(n, -1, -1).clone()  # round 0: everyone's initial cores
            state.seen = torch.eye(n, dtype=torch.bool, device=C.device)
        return state

    def round(self, state: APPLEState, t: int, ops: ClientOps) -> tuple[APPLEState, dict]:
        c = self.cfg
        clients = sample_clients(ops.n_clients, c.client_rate, self.seed, t).to(state.C.device)
        n, d = state.C.shape
        held, seen, down = state.held, state.seen, n - 1
        if held is not None:  # download M of the others' cores, keep the copies
            down = c.downloads if t > 0 else 0  # round 0: the initial cores, from seeds
            fresh = pick_downloads(state.P, seen, clients, down, self.base(t, n), self.seed, t)
            held, seen = held.clone(), seen.clone()
            rows, cols = fresh.nonzero(as_tuple=True)  # (sampled client's row, core)
            held[clients[rows], cols] = state.C[cols]
            seen[clients[rows], cols] = True
        mu = mu_at(c, self.rounds, t)
        cores = state.C if held is None else held[clients]
        new, rows, losses = local_steps(ops, clients, cores, state.C, state.P, state.p0, c, mu, t)
        C, P = state.C.clone(), state.P.clone()
        C[clients], P[clients] = new, rows
        if held is not None:
            held[clients, clients] = new  # a client's own core is always current
        # each sampled client downloads the others' cores (M of them, or all) and uploads
        # its own, float32
        sent = clients.numel() * (down + 1) * d * FLOAT
        return APPLEState(C, P, state.p0, held, seen), {
            "train_loss": float(losses.mean()),
            "bytes_sent": float(sent),
        }

    def base(self, t: int, n: int) -> float:
        """The download draw's base at round t: max(download_base, t M / n growth)."""
        c = self.cfg
        return max(draw_base(c), t * c.downloads / n * draw_growth(c))

    def eval_params(self, state: APPLEState) -> torch.Tensor:
        if state.held is None:
            return state.P @ state.C
        return mix(state.P, state.held)

    def collaboration(self, state: APPLEState) -> torch.Tensor:
        return state.P
