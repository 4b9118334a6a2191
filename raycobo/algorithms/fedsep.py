"""FedSep: separated communication and learning layers (communication-efficient FL).

Li, Huang, "Resolving the Tug-of-War: A Separation of Communication and Learning in
Federated Learning" (FedSep)
-- Section 3 (Algorithm 1) and Section 4.1 (communication-efficient FL).

Every round the sampled clients
1. decode the server's communication parameter x (p numbers) into their learning
   parameter y_x = argmin_y g(x, y) (lines 7-11);
2. run I local SGD steps on their own loss, Delta y = y_I - y_0 (lines 13-16);
3. encode the update back, Delta x = Enc{Delta y} with Enc = -grad_x y_x (line 18, Eq. 2),
4. and the server steps x <- x - eta_g mean_m Delta x (line 20).

Communication-efficient FL (Eq. 4): g(omega, theta) = 1/2 ||S theta - omega||^2 +
beta ||theta||_1 with a Gaussian sketch S (p x d, entries N(0, 1/p), so the columns
have unit norm in expectation), shared by all clients or one per client. Decoding is
FISTA (the proximal gradient method of the paper's reference [3]) warm-started from the
client's previous solution. Encoding:

- ``exact`` (Eq. 5): implicit differentiation of the fixed point of the proximal step.
  With A the active set {j : |theta_j + gamma S^T(omega - S theta)_j| > gamma beta} (U in
  Eq. 5), the LASSO solution moves only on A and d theta_A = (S_A^T S_A)^{-1} S_A^T
  d omega, so Enc{v} = -S_A (S_A^T S_A)^{-1} v_A (Eq. 5 reduces to this on A).
- ``neumann`` (Eq. 3): the inverse replaced by tau sum_{q=0}^{Q} (I - tau S_A^T S_A)^q.

Readings and corrections, where the paper is ambiguous:

- Signs. Remark 1 requires Enc{-grad f} = grad h = (d y_x / d x)^T grad f, so Enc{v} =
  -(d y/d x)^T v, and line 20 then descends h. Eq. (5) and Remark 2 drop this minus sign;
  we keep it (so that S = I, p = d, beta = 0 is exactly FedAvg: tested).
- Remark 2's closed forms (S^T S)^{-1} S^T and S (S^T S)^{-1} need S^T S invertible, i.e.
  p >= d. For p < d (the compression case) and beta = 0 the minimiser is not unique; we
  require beta > 0 there (the active set then has at most p coordinates and S_A^T S_A is
  invertible) and say so in a one-line error.
- beta = 0 has no threshold: every coordinate is active (U = I).
- x^0 = S theta^0 (the model's initialisation encoded; the decoded start is its sparse
  approximation). With x^0 = 0 the LASSO solution stays 0 and its exact hyper-gradient
  is 0, so training could never start.
- Aggregation is the plain mean over the sampled clients (line 20), not size-weighted.
- A client's prediction model is its decoded y_x (one shared model when S is shared).

Communication is counted in bytes of float32 values (and int32 indices), both ways.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field

from raycobo import rng
from raycobo.algorithms.base import ClientOps, all_clients
from raycobo.algorithms.common import FLOAT, local_sgd, sample_clients
from raycobo.algorithms.settings import (
    ClientSampling,
    Decoding,
    LocalTraining,
    MethodConfig,
    ServerStep,
)
from raycobo.settings import ConfigError


class FedSepConfig(LocalTraining, ClientSampling, ServerStep, Decoding, MethodConfig):
    """FedSep (Algorithm 1, Section 4.1)."""

    name: Literal["fedsep"] = "fedsep"
    sketch: Literal["gaussian", "identity"] = Field(default="gaussian", description="A")
    sketch_dim: int | None = Field(default=None, ge=1, description="p; null: d")
    sketch_shared: bool = Field(default=True, description="one A for all clients")
    sparsity: float = Field(default=1e-3, ge=0, description="beta of the LASSO decoder")
    fedsep_encoder: Literal["exact", "neumann"] = Field(
        default="neumann", description="how the encoder inverts A A^T"
    )
    neumann_terms: int = Field(default=20, ge=0, description="Q")
    neumann_tau: float | None = Field(default=None, gt=0, description="null: FISTA step")


MAX_SKETCH_BYTES = 4 * 2**30


# ---------------------------------------------------------------------------------------
# sketch, decode (LASSO by FISTA), encode (implicit function)


def gaussian_sketch(p: int, d: int, seed: int, salt: int = 0) -> torch.Tensor:
    """S in R^{p x d} with i.i.d. N(0, 1/p) entries, deterministic in (seed, salt)."""
    g = torch.Generator().manual_seed(int(rng.hash_ints(seed, rng.INIT, 0x5E7C, salt)))
    return torch.randn(p, d, generator=g) / p**0.5


def spectral_norm_sq(S: torch.Tensor, iters: int = 50) -> float:
    """||S||_2^2 by power iteration on S^T S (an upper estimate with a 1 % margin)."""
    v = torch.ones(S.shape[1], dtype=S.dtype, device=S.device)
    v = v / v.norm()
    lam = 0.0
    for _ in range(iters):
        w = S.T @ (S @ v)
        lam = float(w.norm())
        if lam == 0:
            return 1.0
        v = w / lam
    return 1.01 * lam


def soft_threshold(z: torch.Tensor, tau: float) -> torch.Tensor:
    return torch.sign(z) * torch.clamp(z.abs() - tau, min=0)


def _apply(S: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """S v for every row: S (p, d) shared or (m, p, d) per client; V (m, d) -> (m, p)."""
    return V @ S.T if S.dim() == 2 else torch.bmm(S, V.unsqueeze(2)).squeeze(2)


def _apply_t(S: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """S^T r for every row: R (m, p) -> (m, d)."""
    return R @ S if S.dim() == 2 else torch.bmm(R.unsqueeze(1), S).squeeze(1)


def lasso_decode(
    S: torch.Tensor,
    omega: torch.Tensor,
    beta: float,
    gamma: float,
    steps: int,
    start: torch.Tensor | None = None,
) -> torch.Tensor:
    """argmin_theta 1/2 ||S theta - omega||^2 + beta ||theta||_1 for every row of omega
    (m, p) by ``steps`` FISTA iterations with step gamma <= 1/||S||^2. -> (m, d)."""
    m, d = omega.shape[0], S.shape[-1]
    theta = (
        torch.zeros(m, d, dtype=omega.dtype, device=omega.device)
        if start is None
        else start.clone()
    )
    y, k = theta.clone(), 1.0
    for _ in range(steps):
        grad = _apply_t(S, _apply(S, y) - omega)
        new = soft_threshold(y - gamma * grad, gamma * beta)
        k_next = (1 + (1 + 4 * k * k) ** 0.5) / 2
        y = new + ((k - 1) / k_next) * (new - theta)
        theta, k = new, k_next
    return theta


def active_set(
    S: torch.Tensor, omega: torch.Tensor, theta: torch.Tensor, beta: float, gamma: float
) -> torch.Tensor:
    """U of Eq. (5): coordinates whose proximal-step input exceeds the threshold. (m, d)"""
    if beta == 0:
        return torch.ones_like(theta, dtype=torch.bool)
    z = theta + gamma * _apply_t(S, omega - _apply(S, theta))
    return z.abs() > gamma * beta


def encode_exact(S: torch.Tensor, active: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Enc{v} = -(d theta / d omega)^T v = -S_A (S_A^T S_A)^{-1} v_A per row. -> (m, p)

    ``active`` is (m, d), or (1, d) when every row shares the sketch and the active set
    (a shared sketch decodes the same omega to the same theta): then one Cholesky
    factorisation serves all rows."""
    shared = active.shape[0] == 1 and S.dim() == 2
    groups = (
        [(torch.arange(V.shape[0]), S, active[0])]
        if shared
        else [
            (torch.tensor([k]), S if S.dim() == 2 else S[k], active[k]) for k in range(V.shape[0])
        ]
    )
    out = torch.zeros(V.shape[0], S.shape[-2], dtype=V.dtype, device=V.device)
    for rows, Sk, act in groups:
        A = torch.nonzero(act).flatten()
        if A.numel() == 0:
            continue
        SA = Sk[:, A].double()  # (p, |A|)
        gram = SA.T @ SA
        rhs = V[rows][:, A].double().T  # (|A|, r)
        L, info = torch.linalg.cholesky_ex(gram)
        if int(info) == 0:
            sol = torch.cholesky_solve(rhs, L)
        else:  # |A| > p or a degenerate sketch: least squares
            sol = torch.linalg.lstsq(gram, rhs).solution
        out[rows.to(V.device)] = -(SA @ sol).T.to(V.dtype)
    return out


def encode_neumann(
    S: torch.Tensor, active: torch.Tensor, V: torch.Tensor, terms: int, tau: float
) -> torch.Tensor:
    """Eq. (3): -tau S_A sum_{q=0}^{Q} (I - tau S_A^T S_A)^q v_A, batched. -> (m, p)"""
    mask = active.to(V.dtype)  # (m, d) or (1, d)
    u = V * mask
    acc = u.clone()
    for _ in range(terms):
        u = u - tau * _apply_t(S, _apply(S, u)) * mask
        acc += u
    return -tau * _apply(S, acc)


# ---------------------------------------------------------------------------------------
# FedSep (communication-efficient)


@dataclass
class FedSepState:
    x: torch.Tensor  # (p,) the communication parameter omega
    Y: torch.Tensor  # (n, d) each client's last decoded learning parameter (warm start)
    S: torch.Tensor  # (p, d) shared sketch or (n, p, d) one per client
    gamma: float  # FISTA step, 1 / max_m ||S_m||^2


class FedSep:
    name = "fedsep"

    def __init__(self, cfg: FedSepConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    def _dims(self, ops: ClientOps) -> tuple[int, int]:
        c, d = self.cfg, ops.dim
        p = d if c.sketch == "identity" else (c.sketch_dim or d)
        if c.sketch == "identity" and c.sketch_dim not in (None, d):
            raise ConfigError(
                f"invalid config key 'algorithm.sketch_dim': {c.sketch_dim}, but the "
                f"identity sketch has p = d = {d}"
            )
        if p < d and c.sparsity == 0:
            raise ConfigError(
                f"invalid config key 'algorithm.sparsity': 0 with sketch_dim {p} < d = {d} "
                "leaves the decoder's minimiser non-unique; set sparsity > 0"
            )
        copies = 1 if c.sketch_shared or c.sketch == "identity" else ops.n_clients
        if copies * p * d * 4 > MAX_SKETCH_BYTES:
            raise ConfigError(
                f"invalid config key 'algorithm.sketch_dim': {copies} sketch(es) of {p} x {d} "
                f"need {copies * p * d * 4 / 2**30:.1f} GiB; lower sketch_dim or share it"
            )
        return p, d

    def init(self, ops: ClientOps) -> FedSepState:
        c = self.cfg
        n = ops.n_clients
        p, d = self._dims(ops)
        dev = ops.device
        if c.sketch == "identity":
            S = torch.eye(d, device=dev)
        elif c.sketch_shared:
            S = gaussian_sketch(p, d, self.seed).to(dev)
        else:
            S = torch.stack([gaussian_sketch(p, d, self.seed, 1 + m) for m in range(n)]).to(dev)
        sketches = [S] if S.dim() == 2 else list(S)
        gamma = 1.0 / max(spectral_norm_sq(Sm) for Sm in sketches)  # a step for all
        theta0 = ops.initial_params()
        x = S @ theta0 if S.dim() == 2 else S[0] @ theta0  # x^0 = S theta^0
        Y = torch.zeros(n, d, device=dev)
        state = FedSepState(x, Y, S, gamma)
        everyone = all_clients(ops)
        state.Y = self._decode(state, everyone, warm=False)
        return state

    def _sketch(self, state: FedSepState, clients: torch.Tensor) -> torch.Tensor:
        return state.S if state.S.dim() == 2 else state.S[clients]

    def _decode(self, state: FedSepState, clients: torch.Tensor, warm: bool = True):
        c = self.cfg
        omega = state.x.expand(clients.numel(), -1)
        if c.sketch == "identity" and c.sparsity == 0:
            return omega.clone()  # Dec = I (Remark 2 with S = I)
        start = state.Y[clients] if warm else None
        if state.S.dim() == 2:  # one sketch: every client decodes the same omega alike
            one = lasso_decode(
                state.S,
                omega[:1],
                c.sparsity,
                state.gamma,
                c.decode_steps,
                None if start is None else start[:1],
            )
            return one.expand(clients.numel(), -1).clone()
        S = self._sketch(state, clients)
        return lasso_decode(S, omega, c.sparsity, state.gamma, c.decode_steps, start)

    def _encode_mean(self, state: FedSepState, clients: torch.Tensor, Y0, V) -> torch.Tensor:
        """mean_m Enc_m{V_m} (p,). Enc is linear, so with one shared sketch (hence one
        decoded point and one active set) the mean of the clients' encodings is the
        encoding of their mean update: computed once, bit-for-bit the same algorithm."""
        c = self.cfg
        S = self._sketch(state, clients)
        omega = state.x.expand(clients.numel(), -1)
        if S.dim() == 2:
            omega, Y0, V = omega[:1], Y0[:1], V.mean(dim=0, keepdim=True)
        active = active_set(S, omega, Y0, c.sparsity, state.gamma)
        if c.fedsep_encoder == "neumann":
            tau = c.neumann_tau if c.neumann_tau is not None else state.gamma
            return encode_neumann(S, active, V, c.neumann_terms, tau).mean(dim=0)
        return encode_exact(S, active, V).mean(dim=0)

    def round(self, state: FedSepState, t: int, ops: ClientOps) -> tuple[FedSepState, dict]:
        c = self.cfg
        clients = sample_clients(ops.n_clients, c.client_rate, self.seed, t).to(state.x.device)
        Y0 = self._decode(state, clients)  # lines 5-11
        Y, loss = local_sgd(ops, clients, Y0, c.lr, c.local_steps, t, rng.STEP)  # 13-16
        dx = self._encode_mean(state, clients, Y0, Y - Y0)  # line 18, averaged
        x = state.x - c.server_lr * dx  # line 20
        Ynew = state.Y.clone()
        Ynew[clients] = Y0
        m, p = clients.numel(), state.x.numel()
        new = FedSepState(x, Ynew, state.S, state.gamma)
        return new, {
            "train_loss": float(loss.mean()),
            "bytes_sent": float(2 * m * p * FLOAT),  # x down, Delta x up
            "nonzeros": float((Y0 != 0).sum(dim=1).float().mean()),
        }

    def eval_params(self, state: FedSepState) -> torch.Tensor:
        """Every client predicts with Dec_m(omega) of the current omega (warm-started
        from its last decoded point): the model it would train from next round."""
        return self._decode(state, torch.arange(state.Y.shape[0], device=state.Y.device))

    def collaboration(self, state: FedSepState) -> None:
        return None


# ---------------------------------------------------------------------------------------
# Top-K with error feedback
