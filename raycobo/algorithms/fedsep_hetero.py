"""FedSep, model-heterogeneous (Li, Huang, Huang, Section 4.2): each client trains a
sub-model chosen by a data-driven channel mask within its resource budget; the server
aggregates the masked updates (Remark 3). ``mask_selection``: ``learned`` (Eq. 6-7),
``fixed`` (HeteroFL) or ``random`` (Federated Dropout) for comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
from pydantic import Field, model_validator

from raycobo import rng
from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.common import (
    FLOAT,
    sample_clients,
    top_indices,
)
from raycobo.algorithms.settings import (
    ClientSampling,
    Decoding,
    LocalTraining,
    MethodConfig,
    ServerStep,
)
from raycobo.settings import ConfigError


class FedSepHeteroConfig(LocalTraining, ClientSampling, ServerStep, Decoding, MethodConfig):
    """FedSep for model-heterogeneous FL (Section 4.2): sub-model budgets p^(m)."""

    name: Literal["fedsep_hetero"] = "fedsep_hetero"
    budgets: list[float] = Field(
        default_factory=lambda: [1.0, 0.5, 0.25, 0.125, 0.0625],
        description="p^(m): sub-model budgets",
    )
    mask_lr: float = Field(default=0.1, gt=0, description="step size of the mask search")
    resource_weight: float = Field(default=10.0, ge=0, description="beta of Eq. 7")
    mask_selection: Literal["learned", "fixed", "random"] = Field(
        default="learned", description="how sub-model masks are chosen"
    )

    @model_validator(mode="after")
    def _budgets(self) -> FedSepHeteroConfig:
        if not self.budgets or any(not 0 < b <= 1 for b in self.budgets):
            raise ValueError("budgets: every sub-model budget must be in (0, 1]")
        return self


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
    layers: list[MaskLayer]  # the maskable hidden layers of the model
    head: tuple[int, int]  # the classifier's (channels, size), always kept
    T_tot: float  # multiply-adds of the full model


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

    def __init__(self, cfg: FedSepHeteroConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    def init(self, ops: ClientOps) -> HeteroState:
        layers, head = maskable_layers(ops.param_layout())
        n = ops.n_clients
        U = sum(L.channels for L in layers)
        choices = torch.tensor(self.cfg.budgets, dtype=torch.float32)
        pick = rng.randint(
            torch.tensor(len(choices)), self.seed, rng.SAMPLER, 0xB0D, torch.arange(n)
        )
        budget = choices[pick].to(ops.device)
        T_tot = float(flops(layers, head, torch.ones(1, U))[0])
        A = torch.ones(n, U, device=ops.device)
        return HeteroState(ops.initial_params().clone(), A, A.clone(), budget, layers, head, T_tot)

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
            return A, top_share(state.layers, score, budget)
        omega = state.w.expand(clients.numel(), -1)
        for s in range(c.decode_steps):
            M = expand_mask(state.layers, A, d)
            G, _ = ops.grads(clients, M * omega, t, rng.LOSS, s)
            grad = unit_gradient(state.layers, G * omega)
            with torch.enable_grad():
                a = A.detach().requires_grad_()
                R = resource_loss(flops(state.layers, state.head, a), budget, state.T_tot).sum()
                (dR,) = torch.autograd.grad(R, a)
            A = (A - c.mask_lr * (grad + c.resource_weight * dR)).clamp(0, 1)
        return A, top_share(state.layers, A, budget)

    def round(self, state: HeteroState, t: int, ops: ClientOps) -> tuple[HeteroState, dict]:
        c = self.cfg
        clients = sample_clients(ops.n_clients, c.client_rate, self.seed, t).to(state.w.device)
        A, B = self._select(ops, state, clients, t)
        M = expand_mask(state.layers, B, ops.dim)  # (m, d) in {0, 1}
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
        share = flops(state.layers, state.head, B) / state.T_tot
        return replace(state, w=w, A=newA, B=newB), {
            "train_loss": float(loss.mean()),
            "bytes_sent": float(2 * kept.sum() * FLOAT),  # sub-model down, its update up
            "flops_share": float(share.mean()),
        }

    def eval_params(self, state: HeteroState) -> torch.Tensor:
        return expand_mask(state.layers, state.B, state.w.numel()) * state.w

    def collaboration(self, state: HeteroState) -> None:
        return None
