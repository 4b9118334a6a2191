"""Clients joining and leaving between rounds (CoBo Section 2): a mixin of ``CoBo``."""

from __future__ import annotations

from dataclasses import replace

import torch

from raycobo.algorithms.cobo import weights


class Membership:
    """``base.Elastic`` for CoBo: a client that leaves keeps its model and W entries; one
    that joins restarts its W row and column at W^0, and its pairs' W step restarts its
    decay (``PairClock``)."""

    def leave(self, state, clients: list[int]):
        """Clients leave: they stop training and collaborating; their models and W
        entries are kept (a returning client resumes its model; with ``fade`` its weights
        below the pull's threshold fade while it is away, as every other's do)."""
        weights.require_dense(state.W, "clients joining or leaving")
        active = _active(state.active, state.X.shape[0], state.X.device)
        active[torch.as_tensor(clients, device=active.device)] = False
        return replace(state, active=active)

    def join(self, state, clients: list[int], t: int):
        """Clients join before round t: their W row and column restart at W^0 (box: 0
        with a pull threshold, 1 without, w_ii = 1; simplex: uniform over the present
        others, and the others' rows give them weight 0 until sampled), and their pairs'
        W step restarts its decay (a newcomer's pairs are learned as the first rounds'
        are)."""
        weights.require_dense(state.W, "clients joining or leaving")
        n = state.X.shape[0]
        active = _active(state.active, n, state.X.device)
        new = torch.as_tensor(clients, device=active.device)
        active[new] = True
        joined = state.joined
        joined = torch.zeros(n, dtype=torch.int64) if joined is None else joined.clone()
        joined[new.cpu()] = int(t)
        W = state.W.clone()
        if self.cfg.domain == "box":
            W[new, :] = self.w0
            W[:, new] = self.w0
            W[new, new] = 1.0
        else:
            others = active.clone()
            W[new, :] = 0.0
            W[:, new] = 0.0
            for k in new.tolist():
                others[k] = False
                W[k, others] = 1.0 / max(int(others.sum()), 1)
                others[k] = True
        return replace(state, W=W, active=active, joined=joined)


def _active(active: torch.Tensor | None, n: int, device) -> torch.Tensor:
    return torch.ones(n, dtype=torch.bool, device=device) if active is None else active.clone()
