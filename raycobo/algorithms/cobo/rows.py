"""CoBo's round on some clients' rows: what a host that keeps its clients' models and
W rows computes (the Ray engine's resident hosts), from the gradients and the other
hosts' models it reads -- the equations of ``CoBo.round``, restricted to rows."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raycobo.algorithms.cobo import weights
from raycobo.algorithms.cobo.pull import penalized_rows_blocks, pull_weights, stepped_models
from raycobo.algorithms.cobo.requests import batch_salts, mean_of_batches
from raycobo.algorithms.cobo.score import alignment_scores
from raycobo.algorithms.cobo.wstep import WStep, update_weight_rows


@dataclass(frozen=True)
class RowStep:
    """Round t's CoBo on some clients' rows: what a host that keeps its clients' models
    and W rows computes (the Ray engine's resident hosts), from the gradients and the
    other hosts' models it reads. Built by ``CoBo.row_step``; the equations are those
    of ``CoBo.round``, restricted to rows."""

    lr: float
    rho: float
    w_step: WStep  # Eq. (1)'s step this round
    domain: str
    alignment: str
    floor: float  # the bounded cosine's least denominator
    pull: str
    threshold: float  # the pull's threshold on w_ij
    at: str  # where the pull acts: "current" models x^t or "stepped" x^t - lr g
    batches: int = 1  # the minibatches each alignment gradient averages
    fade: float = 0.0  # what each weight below the threshold loses this round (``fade``)

    @staticmethod
    def midpoints(X_own: torch.Tensor, X_partners: torch.Tensor) -> torch.Tensor:
        """z_ij = (x_i + x_j) / 2, where the pair's alignment gradients are taken."""
        return 0.5 * (X_own + X_partners)

    def align_requests(
        self, clients: torch.Tensor, Z: torch.Tensor, salts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rows of a gradient request for these alignment gradients: each repeated
        for every minibatch it averages (``mean_of_batches`` of the answer)."""
        k = self.batches
        if k == 1:
            return clients, Z, salts
        return clients.repeat(k), Z.repeat(k, 1), batch_salts(salts, k)

    def align_mean(self, G: torch.Tensor) -> torch.Tensor:
        """The answer to ``align_requests``' rows: one gradient per alignment row."""
        return mean_of_batches(G, self.batches)

    def stepped(
        self, X: torch.Tensor, members: torch.Tensor, G: torch.Tensor
    ) -> torch.Tensor | None:
        """The models the pull acts on where it acts on the stepped ones (x - lr g for
        the clients stepping, x for the others; None: it acts on x^t)."""
        if self.at != "stepped":
            return None
        Y = X.clone()
        Y[members] = stepped_models(X[members], G, self.lr)
        return Y

    def faded(self, W_rows: torch.Tensor) -> torch.Tensor:
        """The rows after the round's fade (``CoBo.faded``), before Eq. (1)."""
        return weights.faded(W_rows, self.threshold, self.fade)

    def update_w(
        self, W_rows: torch.Tensor, ids: torch.Tensor, edges, G_i, G_j
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. (1) on the rows ``ids`` from the pairs' alignment gradients. -> (the new
        rows, the pairs' scores)"""
        scores = alignment_scores(G_i, G_j, self.alignment, self.floor)
        return update_weight_rows(W_rows, ids, edges, scores, self.w_step, self.domain), scores

    def step(self, X_rows, G, Y_rows, W_rows, blocks) -> torch.Tensor:
        """Eq. (3) for some clients with their W rows over the models in ``blocks``
        ((cols, models) of the hosts read: x^t, or the stepped models ``Y_rows`` and
        the other hosts' where the pull acts on those)."""
        W_rows = pull_weights(W_rows, self.pull, self.threshold)
        if Y_rows is not None:  # the pull alone, on the stepped models
            return penalized_rows_blocks(Y_rows, None, W_rows, blocks, self.lr, self.rho)
        return penalized_rows_blocks(X_rows, G, W_rows, blocks, self.lr, self.rho)


class InRows:
    """CoBo's side of ``base.StepsInRows`` (a mixin of ``CoBo``): the rows state the
    coordinator keeps (W, membership and the extras, no models) and each round's
    ``RowStep``."""

    def rows_refusal(self) -> str | None:
        """Why these settings cannot step in rows on hosts (None: they can): a host
        keeps dense W rows, steps without momentum from one shared x^0, W first."""
        c = self.cfg
        plain = (
            c.weights != "sparse"
            and c.momentum == 0
            and c.init == "shared"
            and c.order == "weights_first"
        )
        if plain:
            return None
        return (
            "host-resident models run cobo with a dense W (algorithm.weights), no "
            "momentum, init shared and order weights_first"
        )

    def row_step(self, t: int, state) -> RowStep:
        """Round t's settings for hosts that each keep some clients' rows."""
        return RowStep(
            self.pull.lr,
            self.pull.rho_for(state.X.shape[0]),
            self.step_in(state, t),
            self.cfg.domain,
            self.cfg.alignment,
            self.floor(state),
            self.pull.kind,
            self.pull.threshold,
            self.pull.at,
            self.batches,
            self.fade_at(t, self.present(state)),
        )

    def rows_start(self, ops) -> tuple[torch.Tensor, dict]:
        """W^0 for hosts that keep the rows (dense), and the floored score's unit."""
        self.pull.rho_for(ops.n_clients)  # an unstable explicit rho stops here
        X0 = ops.initial_params().expand(ops.n_clients, -1)
        W = weights.initial_weights(ops.n_clients, self.cfg.domain, value=self.cfg.initial_weight)
        return W, {"scale": self.initial_scale(ops, X0)}

    def rows_state(self, W: torch.Tensor, active: torch.Tensor | None, extras: dict):
        """W and membership as a CoBoState (the models stay in the hosts)."""
        return self.State(
            torch.empty(W.shape[0], 0),
            W,
            active,
            scale=extras.get("scale"),
            joined=extras.get("joined"),
        )

    @staticmethod
    def rows_extras(state) -> dict:
        """The extras of ``rows_state`` that ``state`` holds (after a join: the pairs'
        clocks)."""
        out = {"scale": state.scale}
        if state.joined is not None:
            out["joined"] = state.joined
        return out

    def rows_read(self, W: torch.Tensor) -> torch.Tensor:
        """The entries Eq. (3) reads: w_ij > 0 and at least the pull's threshold."""
        return self.pull.read(W).gt(0)

    def updates_whole_rows(self) -> bool:
        return self.cfg.domain == "simplex"  # a projected row can turn any entry > 0
