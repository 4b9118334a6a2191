"""FedSep: separated communication and learning layers, and the Top-K baseline.

Li, Huang, Huang, "FedSep: A Novel Two-Layer Federated Learning Framework"
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

Top-K with error feedback (the paper's baseline, Stich et al.): each client adds its
error memory to its local update, sends the K largest entries (value + index) and keeps
the rest as memory; the server averages the sparse updates and broadcasts the (dense)
result.

Communication is counted in bytes of float32 values (and int32 indices), both ways.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from raycobo import rng
from raycobo.algorithms.base import ClientOps, all_clients
from raycobo.algorithms.common import local_sgd, sample_clients, top_indices
from raycobo.config import AlgorithmConfig, ConfigError

FLOAT, INDEX = 4, 4  # bytes per sent value / index

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

    def __init__(self, cfg: AlgorithmConfig, rounds: int, seed: int):
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

    def prediction(self, state: FedSepState, ops: ClientOps) -> torch.Tensor:
        return self._decode(state, all_clients(ops))

    def evaluate(self, state: FedSepState, ops: ClientOps):
        return ops.evaluate(all_clients(ops), self.prediction(state, ops))

    def eval_params(self, state: FedSepState) -> torch.Tensor:
        return state.Y

    def collaboration(self, state: FedSepState) -> None:
        return None


# ---------------------------------------------------------------------------------------
# Top-K with error feedback


@dataclass
class TopKState:
    x: torch.Tensor  # (d,) global model
    E: torch.Tensor  # (n, d) error memories


def top_count(cfg: AlgorithmConfig, d: int) -> int:
    """K of the top-K compressors, from ``algorithm.topk_fraction``."""
    return max(1, min(d, round(cfg.topk_fraction * d)))


def local_updates(ops: ClientOps, x: torch.Tensor, cfg: AlgorithmConfig, seed: int, t: int):
    """The sampled clients' local SGD updates from the global model x (d,).
    -> (clients (m,), updates y - x (m, d), first-step losses (m,))"""
    clients = sample_clients(ops.n_clients, cfg.client_rate, seed, t).to(x.device)
    start = x.expand(clients.numel(), -1)
    Y, loss = local_sgd(ops, clients, start, cfg.lr, cfg.local_steps, t, rng.STEP)
    return clients, Y - start, loss


def top_k(V: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest-magnitude entries of every row, zero the rest."""
    idx = top_indices(V.abs(), k)
    return torch.zeros_like(V).scatter_(1, idx, V.gather(1, idx))


class TopKEF:
    name = "topk_ef"

    def __init__(self, cfg: AlgorithmConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    def init(self, ops: ClientOps) -> TopKState:
        x = ops.initial_params().clone()
        return TopKState(x, torch.zeros(ops.n_clients, ops.dim, dtype=x.dtype, device=x.device))

    def round(self, state: TopKState, t: int, ops: ClientOps) -> tuple[TopKState, dict]:
        c = self.cfg
        d = ops.dim
        k = top_count(c, d)
        clients, delta, loss = local_updates(ops, state.x, c, self.seed, t)
        V = delta + state.E[clients]  # update plus memory
        sent = top_k(V, k)
        E = state.E.clone()
        E[clients] = V - sent
        update = sent.mean(dim=0)
        x = state.x + c.server_lr * update
        m = clients.numel()
        down = int((update != 0).sum())
        # up: k (value, index) pairs per client; down: the aggregate, dense or as pairs
        bytes_down = m * min(d * FLOAT, down * (FLOAT + INDEX))
        return TopKState(x, E), {
            "train_loss": float(loss.mean()),
            "bytes_sent": float(m * k * (FLOAT + INDEX) + bytes_down),
        }

    def eval_params(self, state: TopKState) -> torch.Tensor:
        return state.x.expand(state.E.shape[0], -1)

    def collaboration(self, state: TopKState) -> None:
        return None


# ---------------------------------------------------------------------------------------
# FedSep for model-heterogeneous FL (Section 4.2)


@dataclass
class MaskLayer:
    """A layer whose channels (output units / filters) a client may drop."""

    offset: int  # of the weight block (channels x size)
    channels: int
    size: int  # inputs per channel
    bias: int | None  # offset of the per-channel bias vector, if the next block is one


def maskable_layers(layout: list[tuple[int, int, int]]) -> tuple[list[MaskLayer], tuple]:
    """The hidden layers of ``param_layout`` (every multi-channel weight block but the
    last, the classifier, which every sub-model keeps) and the classifier's
    (channels, size)."""
    weights = [k for k, (_, ch, _) in enumerate(layout) if ch > 1]
    if len(weights) < 2:
        raise ConfigError(
            "invalid config key 'algorithm.name': fedsep_hetero selects channels of hidden "
            "layers; this model has none (use an MLP or a conv net)"
        )
    layers = []
    for k in weights[:-1]:
        off, ch, size = layout[k]
        nxt = layout[k + 1] if k + 1 < len(layout) else None
        bias = nxt[0] if nxt is not None and nxt[1] == 1 and nxt[2] == ch else None
        layers.append(MaskLayer(off, ch, size, bias))
    _, ch, size = layout[weights[-1]]
    return layers, (ch, size)


def expand_mask(layers: list[MaskLayer], A: torch.Tensor, d: int) -> torch.Tensor:
    """Unit masks A (m, U) -> coordinate masks (m, d); coordinates outside the hidden
    layers (the classifier, norms) are always kept."""
    M = torch.ones(A.shape[0], d, dtype=A.dtype, device=A.device)
    u = 0
    for L in layers:
        a = A[:, u : u + L.channels]
        M[:, L.offset : L.offset + L.channels * L.size] = a.repeat_interleave(L.size, dim=1)
        if L.bias is not None:
            M[:, L.bias : L.bias + L.channels] = a
        u += L.channels
    return M


def unit_gradient(layers: list[MaskLayer], GW: torch.Tensor) -> torch.Tensor:
    """d L(a . omega) / d a for unit masks: the coordinate products G * omega (m, d)
    summed over each unit's coordinates. -> (m, U)"""
    parts = []
    for L in layers:
        w = GW[:, L.offset : L.offset + L.channels * L.size].reshape(-1, L.channels, L.size)
        g = w.sum(dim=2)
        if L.bias is not None:
            g = g + GW[:, L.bias : L.bias + L.channels]
        parts.append(g)
    return torch.cat(parts, dim=1)


def flops(layers: list[MaskLayer], head: tuple[int, int], A: torch.Tensor) -> torch.Tensor:
    """Multiply-adds of the sub-models (m,): each kept channel costs its inputs times the
    share of the previous layer's channels kept; the classifier sees the last layer's."""
    total = torch.zeros(A.shape[0], dtype=A.dtype, device=A.device)
    share_in = torch.ones_like(total)
    u = 0
    for L in layers:
        a = A[:, u : u + L.channels]
        total = total + a.sum(dim=1) * L.size * share_in
        share_in = a.mean(dim=1)
        u += L.channels
    return total + head[0] * head[1] * share_in


def resource_loss(T: torch.Tensor, budget: torch.Tensor, T_tot: float) -> torch.Tensor:
    """R(T(a), p T_tot) = log(max(T(a), p T_tot) / (p T_tot)) (Gao et al., per client)."""
    target = budget * T_tot
    return torch.log(torch.maximum(T, target) / target)


def top_share(layers: list[MaskLayer], A: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """Binary masks keeping the ceil(p * C) largest-a channels of every layer (the
    paper's selection of the top p of each layer's kernels). -> (m, U) in {0, 1}"""
    out = torch.zeros_like(A)
    u = 0
    for L in layers:
        a = A[:, u : u + L.channels]
        for i in range(A.shape[0]):
            k = max(1, int(math.ceil(float(budget[i]) * L.channels)))
            out[i, u + top_indices(a[i], k)] = 1.0
        u += L.channels
    return out


@dataclass
class HeteroState:
    w: torch.Tensor  # (d,) the server (full) model omega
    A: torch.Tensor  # (n, U) relaxed channel masks a in [0, 1], warm start
    B: torch.Tensor  # (n, U) the binary masks last selected
    budget: torch.Tensor  # (n,) p^(m)


class FedSepHetero:
    """Each client decodes its sub-model theta = a . omega with a data-chosen channel
    mask (Eq. 6-7), trains it, and the server aggregates the masked updates (Remark 3).

    Readings: the mask is relaxed to [0, 1] per channel of the hidden layers (as the
    paper's experiments select kernels), found by ``decode_steps`` projected gradient
    steps (``mask_lr``) on L(a . omega) + beta R(T(a), p T_tot) from the client's previous
    mask, with a training minibatch as the validation loss (the paper: "the validation
    and training set are the same"); then the top p share of each layer's channels is
    kept. The encoder keeps Remark 3's first term (-Diag(a)), so line 20 adds the mean of
    the masked updates over the sampled clients. Budgets p^(m) are drawn per client from
    ``budgets``. A client predicts with its own sub-model."""

    name = "fedsep_hetero"

    def __init__(self, cfg: AlgorithmConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    def init(self, ops: ClientOps) -> HeteroState:
        self.layers, self.head = maskable_layers(ops.param_layout())
        n = ops.n_clients
        U = sum(L.channels for L in self.layers)
        choices = torch.tensor(self.cfg.budgets, dtype=torch.float32)
        pick = rng.randint(
            torch.tensor(len(choices)), self.seed, rng.SAMPLER, 0xB0D, torch.arange(n)
        )
        budget = choices[pick].to(ops.device)
        self.T_tot = float(flops(self.layers, self.head, torch.ones(1, U))[0])
        A = torch.ones(n, U, device=ops.device)
        return HeteroState(ops.initial_params().clone(), A, A.clone(), budget)

    def _select(self, ops, state, clients, t) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode: relaxed masks by projected gradient, then the top-p selection. The
        data-independent baselines score channels by position (``fixed``, HeteroFL) or
        by a fresh hash every round (``random``, Federated Dropout) instead."""
        c = self.cfg
        d = ops.dim
        A = state.A[clients].clone()
        budget = state.budget[clients]
        if c.mask_selection != "learned":
            U = A.shape[1]
            if c.mask_selection == "fixed":
                score = -torch.arange(U, dtype=A.dtype).expand(len(clients), -1)
            else:
                ids = clients.cpu().reshape(-1, 1)
                score = rng.uniform(self.seed, rng.SAMPLER, t, ids, torch.arange(U), 0xD0).float()
            score = score.to(A.device)
            return A, top_share(self.layers, score, budget)
        omega = state.w.expand(clients.numel(), -1)
        for s in range(c.decode_steps):
            M = expand_mask(self.layers, A, d)
            G, _ = ops.grads(clients, M * omega, t, rng.LOSS, s)
            grad = unit_gradient(self.layers, G * omega)
            with torch.enable_grad():
                a = A.detach().requires_grad_()
                R = resource_loss(flops(self.layers, self.head, a), budget, self.T_tot).sum()
                (dR,) = torch.autograd.grad(R, a)
            A = (A - c.mask_lr * (grad + c.resource_weight * dR)).clamp(0, 1)
        return A, top_share(self.layers, A, budget)

    def round(self, state: HeteroState, t: int, ops: ClientOps) -> tuple[HeteroState, dict]:
        c = self.cfg
        clients = sample_clients(ops.n_clients, c.client_rate, self.seed, t).to(state.w.device)
        A, B = self._select(ops, state, clients, t)
        M = expand_mask(self.layers, B, ops.dim)  # (m, d) in {0, 1}
        Y0 = M * state.w  # the sub-models
        Y = Y0.clone()
        loss = None
        for s in range(c.local_steps):  # train the sub-model only
            G, ls = ops.grads(clients, Y, t, rng.STEP, s)
            Y -= c.lr * M * G
            loss = ls if loss is None else loss
        w = state.w + c.server_lr * (M * (Y - Y0)).mean(dim=0)  # Remark 3, line 20
        newA, newB = state.A.clone(), state.B.clone()
        newA[clients], newB[clients] = A, B
        kept = M.sum(dim=1)
        share = flops(self.layers, self.head, B) / self.T_tot
        return HeteroState(w, newA, newB, state.budget), {
            "train_loss": float(loss.mean()),
            "bytes_sent": float(2 * kept.sum() * FLOAT),  # sub-model down, its update up
            "flops_share": float(share.mean()),
        }

    def eval_params(self, state: HeteroState) -> torch.Tensor:
        return expand_mask(self.layers, state.B, state.w.numel()) * state.w

    def collaboration(self, state: HeteroState) -> None:
        return None


# ---------------------------------------------------------------------------------------
# Count-Sketch compression (FetchSGD, Rothchild et al. 2020: the paper's reference [42])


def sketch_hashes(d: int, rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bucket (rows, d) in [0, cols) and sign (rows, d) in {-1, 1} of every coordinate."""
    r = torch.arange(rows).view(-1, 1)
    j = torch.arange(d).view(1, -1)
    bucket = rng.randint(torch.tensor(cols), seed, rng.SAMPLER, 0xC5, r, j)
    sign = torch.where(rng.uniform(seed, rng.SAMPLER, 0xC6, r, j) < 0.5, -1.0, 1.0)
    return bucket, sign


def count_sketch(V: torch.Tensor, bucket: torch.Tensor, sign: torch.Tensor, cols: int):
    """Linear sketch of every row of V (m, d) -> (m, rows, cols)."""
    m, rows = V.shape[0], bucket.shape[0]
    out = torch.zeros(m, rows, cols, dtype=V.dtype, device=V.device)
    for r in range(rows):
        out[:, r].index_add_(1, bucket[r], V * sign[r])
    return out


def unsketch(S: torch.Tensor, bucket: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """Estimate every coordinate of a sketched vector S (rows, cols): the median over
    rows of sign * bucket value. -> (d,)"""
    est = torch.stack([sign[r] * S[r, bucket[r]] for r in range(S.shape[0])])
    return est.median(dim=0).values


@dataclass
class SketchState:
    x: torch.Tensor  # (d,) global model
    Se: torch.Tensor  # (rows, cols) the server's error accumulator, in sketch space


class CountSketchFL:
    """FetchSGD without momentum: clients send Count Sketches of their local updates; the
    server adds their mean to its sketched error accumulator, extracts the top-k
    coordinates (median estimates), applies them and subtracts their sketch."""

    name = "countsketch"

    def __init__(self, cfg: AlgorithmConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    def init(self, ops: ClientOps) -> SketchState:
        c = self.cfg
        self.n = ops.n_clients
        self.cols = c.sketch_cols or max(1, ops.dim // 10)
        bucket, sign = sketch_hashes(ops.dim, c.sketch_rows, self.cols, self.seed)
        self.bucket, self.sign = bucket.to(ops.device), sign.to(ops.device)
        x = ops.initial_params().clone()
        return SketchState(x, torch.zeros(c.sketch_rows, self.cols, dtype=x.dtype, device=x.device))

    def round(self, state: SketchState, t: int, ops: ClientOps) -> tuple[SketchState, dict]:
        c = self.cfg
        d = ops.dim
        k = top_count(c, d)
        if 4 * k > self.cols:
            raise ConfigError(
                f"invalid config key 'algorithm.topk_fraction': {k} coordinates from a sketch "
                f"of {self.cols} columns (need at least 4k; raise algorithm.sketch_cols)"
            )
        clients, delta, loss = local_updates(ops, state.x, c, self.seed, t)
        sketches = count_sketch(delta, self.bucket, self.sign, self.cols)  # (m, r, c)
        Se = state.Se + c.server_lr * sketches.mean(dim=0)  # sketches are linear
        update = top_k(unsketch(Se, self.bucket, self.sign)[None], k)[0]
        Se = Se - count_sketch(update[None], self.bucket, self.sign, self.cols)[0]
        m = clients.numel()
        return SketchState(state.x + update, Se), {
            "train_loss": float(loss.mean()),
            "bytes_sent": float(m * (Se.numel() * FLOAT + min(d * FLOAT, k * (FLOAT + INDEX)))),
        }

    def eval_params(self, state: SketchState) -> torch.Tensor:
        return state.x.expand(self.n, -1)

    def collaboration(self, state: SketchState) -> None:
        return None
