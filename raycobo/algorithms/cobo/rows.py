"""CoBo's round on some clients' rows: what a host that keeps its clients' models and
W rows computes (the Ray engine's resident hosts), from the gradients and the other
hosts' models it reads -- the equations of ``CoBo.round``, restricted to rows."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raycobo.algorithms.cobo import weights
from raycobo.algorithms.cobo.pull import (
    on_stepped,
    penalized_rows_blocks,
    pull_weights,
    stepped_models,
)
from raycobo.algorithms.cobo.wstep import WStep, update_weight_rows


@dataclass(frozen=True)
class RowStep:
    """Round t's CoBo on some clients' rows: what a host that keeps its clients' models
    and W rows computes (``base.StepsInRows`` and ``ScoresPairsInRows``), from the
    gradients and the other hosts' models it reads. Built by ``CoBo.row_step``; the
    equations are those of ``CoBo.round``, restricted to rows."""

    lr: float
    rho: float
    w_step: WStep  # Eq. (1)'s step this round
    domain: str
    score: str  # Eq. (1)'s score (``pairs.SCORES``)
    floor: float  # its least denominator (a floored score's)
    pull: str
    threshold: float  # the pull's threshold on w_ij
    batches: int = 1  # the minibatches each end's gradient averages
    fade: float = 0.0  # what each weight below the threshold loses this round (``fade``)

    @property
    def reads_published(self) -> bool:
        """Whether the step reads the other hosts' stepped models (``published``)."""
        return on_stepped(self.pull)

    @staticmethod
    def points(X_own: torch.Tensor, X_partners: torch.Tensor) -> torch.Tensor:
        """z_ij = (x_i + x_j) / 2, where the pair's gradients are taken."""
        return 0.5 * (X_own + X_partners)

    def published(
        self, X: torch.Tensor, members: torch.Tensor, G: torch.Tensor
    ) -> torch.Tensor | None:
        """The models the pull acts on where it acts on the stepped ones (x - lr g for
        the clients stepping, x for the others; None: it acts on x^t)."""
        if not on_stepped(self.pull):
            return None
        Y = X.clone()
        Y[members] = stepped_models(X[members], G, self.lr)
        return Y

    def update_rows(self, W_rows: torch.Tensor, ids: torch.Tensor, edges, scores) -> torch.Tensor:
        """The round's fade (``CoBo.faded``), then Eq. (1) on the rows ``ids`` from the
        scores of the pairs that touch them."""
        W_rows = weights.faded(W_rows, self.threshold, self.fade)
        if edges.shape[0] == 0:
            return W_rows
        return update_weight_rows(W_rows, ids, edges, scores, self.w_step, self.domain)

    def step(self, X_rows, G, Y_rows, W_rows, blocks) -> torch.Tensor:
        """Eq. (3) for some clients with their W rows over the models in ``blocks``
        ((cols, models) of the hosts read: x^t, or the stepped models ``Y_rows`` and
        the other hosts' where the pull acts on those)."""
        W_rows = pull_weights(W_rows, self.pull, self.threshold)
        if Y_rows is not None:  # the pull alone, on the stepped models
            return penalized_rows_blocks(Y_rows, None, W_rows, blocks, self.lr, self.rho)
        return penalized_rows_blocks(X_rows, G, W_rows, blocks, self.lr, self.rho)


class InRows:
    """CoBo's side of ``base.StepsInRows`` and ``ScoresPairsInRows`` (a mixin of
    ``CoBo``): the rows state the coordinator keeps (W, membership and the extras, no
    models), each round's pairs and ``RowStep``, and the coordinator's W update."""

    def round_pairs(self, active, t: int, n: int, W) -> torch.Tensor:
        """Round t's pairs among the present clients (the proposals' too)."""
        return self.sample_edges(active, t, n, W=W)[0]

    def rows_update(self, state, edges: torch.Tensor, scores: torch.Tensor, t: int):
        """The coordinator's W after round t: the fade, then Eq. (1) from the scores."""
        state = self.faded(state, t)
        return self.apply_scores(state, edges, scores, t) if edges.shape[0] else state

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
            self.batches,
            self.fade_at(t, self.present(state)),
        )

    def rows_start(self, ops) -> tuple[torch.Tensor, dict]:
        """W^0 for hosts that keep the rows (dense), and the floored score's unit."""
        self.pull.rho_for(ops.n_clients)  # an unstable explicit rho stops here
        X0 = ops.initial_params().expand(ops.n_clients, -1)
        W = weights.initial_weights(ops.n_clients, self.cfg.domain, value=self.w0)
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
