"""CoBo's round from its parts: the sampler and the proposals choose the pairs, the score
(``score.py``) and the W step (``wstep.py``) learn W from the pairs' gradients at their
midpoints, and the pull (``pull.py``) steps the models toward their collaborators."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from raycobo import rng
from raycobo.algorithms.base import MODELS, Answer, ClientOps, Gradients, Plan, run_plan
from raycobo.algorithms.cobo import weights
from raycobo.algorithms.cobo.elastic import Membership
from raycobo.algorithms.cobo.proposals import Closure, Proposals, Rechecks
from raycobo.algorithms.cobo.pull import Pull
from raycobo.algorithms.cobo.rows import InRows
from raycobo.algorithms.cobo.score import FLOORED, initial_scale
from raycobo.algorithms.cobo.settings import (
    CoBoConfig,
    PresetView,
    closure,
    fade,
    initial_weight,
    pull_cut,
    recheck,
)
from raycobo.algorithms.cobo.wstep import Schedule, WStep, update_weights
from raycobo.algorithms.common import FLOAT
from raycobo.algorithms.pairs import PairScores, answer_rows, round_bytes
from raycobo.algorithms.samplers import EdgeSampler, n_pairs


@dataclass
class CoBoState:
    X: torch.Tensor  # (n, d) personal models x_i
    W: weights.Weights  # (n, n) collaboration weights w_ij
    active: torch.Tensor | None = None  # (n,) bool: clients in the system (None: all)
    M: torch.Tensor | None = None  # (n, d) the model step's gradient average (momentum)
    # a floored score: the mean squared norm of the clients' gradients at x^0, ()
    scale: torch.Tensor | None = None
    # (n,) int64: the round before which each client last joined (0: from the start;
    # None: no client has joined since) -- each pair's own clock (``PairClock``)
    joined: torch.Tensor | None = None


class CoBo(InRows, Membership):
    name = "cobo"
    State = CoBoState

    def __init__(self, cfg: CoBoConfig, rounds: int, seed: int):
        self.cfg = c = PresetView(cfg)
        self.rounds, self.seed = rounds, seed
        cut = pull_cut(c) or 0.0
        self.batches = int(c.alignment_batches)
        self.w0 = initial_weight(c)  # W^0 between clients (box domain)
        self.pull = Pull(c.pull, c.lr, c.rho, c.domain, cut, c.pull_strength)
        self.schedule = Schedule(c.gamma, c.gamma_decay == "sqrt", cut, fade(c))
        # the re-checks scale up where the sampler's rates do (sampling_samples)
        rechecks = Rechecks(recheck(c), float(c.sampling_samples or 0.0))
        self.proposals = Proposals(rechecks, Closure(closure(c), cut, seed), cut, seed)

    # -- the parts, round by round among the present clients ---------------------------
    def sampler(self, n: int) -> EdgeSampler:
        return EdgeSampler.for_cobo(self.cfg, n, self.rounds, self.seed)

    def w_step(self, t: int, n: int) -> WStep:
        """Round t's Eq. (1) step among n present clients (the re-checked pairs' decay
        counting their re-checks)."""
        sampler = self.sampler(n)
        return self.schedule.w_step(sampler, t, self.proposals.rechecks.floor(sampler))

    def step_in(self, state: CoBoState, t: int) -> WStep:
        """Round t's Eq. (1) step for ``state``'s pairs, each on its own clock."""
        n = self.present(state)
        clock = self.schedule.clock(self.sampler(n), state.joined, t)
        step = self.w_step(t, n)
        return step if clock is None else replace(step, clock=clock)

    def fade_at(self, t: int, n: int) -> float:
        """What each weight below the pull's threshold loses in round t among n present."""
        return self.schedule.fade_at(self.sampler(n), t)

    def faded(self, state: CoBoState, t: int) -> CoBoState:
        """W^t after round t's fade, which comes first in the round's W step."""
        amount = self.fade_at(t, self.present(state))
        if not amount:
            return state
        return replace(state, W=weights.faded(state.W, self.pull.threshold, amount))

    def samples_from_w(self, t: int, n: int) -> bool:
        """Whether round t's pairs among n present clients depend on W^t (re-checks or
        closure): an engine must then sample round t only once round t - 1's W is known."""
        return self.proposals.reads_w(self.sampler(n), t)

    def floor(self, state: CoBoState) -> float:
        """A floored score's least denominator (0 for the others)."""
        if self.cfg.alignment not in FLOORED or state.scale is None:
            return 0.0
        return self.cfg.cosine_floor * float(state.scale)

    def initial_scale(self, ops: ClientOps, X: torch.Tensor) -> torch.Tensor | None:
        return initial_scale(ops, X) if self.cfg.alignment in FLOORED else None

    @staticmethod
    def present(state: CoBoState) -> int:
        return state.X.shape[0] if state.active is None else int(state.active.sum())

    # -- state ------------------------------------------------------------------------
    def init(self, ops: ClientOps) -> CoBoState:
        n, c = ops.n_clients, self.cfg
        if c.init == "independent":  # the authors' code: every client its own model
            X = torch.stack([ops.random_params(salt=i) for i in range(n)])
        else:
            X = ops.initial_params().expand(n, -1).clone()  # x_i^0 = x^0 (Algorithm 1)
        self.pull.rho_for(n)  # an explicit rho beyond the stability bound stops here
        W = weights.initial(n, c.domain, self.w0, self.sparse_w(n), X.device)
        return CoBoState(X, W, scale=self.initial_scale(ops, X))

    def sparse_w(self, n: int) -> bool:
        """Whether W is kept sparse for n clients (``weights``; auto: above 2,048, box)."""
        c = self.cfg
        return c.weights == "sparse" or (c.weights == "auto" and n > 2048 and c.domain == "box")

    def state_bytes(self, n: int, d: int) -> dict[str, int]:
        """x_i, their gradients and the next x_i (and the momentum's average), a dense W
        (n x n) where ``weights`` makes one, and a round's pairs at most (``pairs_at_most``;
        an engine holds their gradients in parts)."""
        E = self.pairs_at_most(n)
        out = {
            MODELS: 4 * n * d * 3,
            f"a round's pairs, at most {E:,} (algorithm.sampling)": round_bytes(E, self.batches, d),
        }
        if self.cfg.momentum > 0:
            out["the momentum's averages (algorithm.momentum=0)"] = 4 * n * d
        if not self.sparse_w(n):
            out["a dense W (algorithm.weights=sparse)"] = 4 * n * n * 2
        return out

    def pairs_at_most(self, n: int) -> int:
        """A bound on the pairs a round draws among n clients: every pair at the
        sampler's highest rate (its scale-up included) and a closure proposal from each
        client at its rate, four standard deviations above their mean. The re-checks add
        a share of the pairs the pull reads, which W decides as the run goes (their
        gradients, like all, are held in parts)."""
        sampler = self.sampler(n)
        mean = sampler.highest_probability() * n_pairs(n) + self.proposals.closure.rate * n
        return min(n_pairs(n), math.ceil(mean + 4 * math.sqrt(mean)))

    # -- a round ----------------------------------------------------------------------
    def sample_edges(
        self, active: torch.Tensor | None, t: int, n_clients: int, device=None, W=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Round t's sampled pairs among the present clients (global ids, i < j, sorted),
        and the present clients (who take the model step); with ``W`` (W^t) the
        proposals' pairs too. -> (edges (E, 2), members (m,))"""
        ids = None if active is None else torch.nonzero(active).flatten()
        n = n_clients if ids is None else ids.numel()  # clients in the system
        sampler = self.sampler(n)
        edges = sampler.sample(t).to(device)  # (E, 2), among the present
        members = torch.arange(n_clients, device=device) if ids is None else ids.to(device)
        if ids is not None:
            edges = members[edges]  # global ids, still i < j
        if W is not None:
            edges = self.proposals.added(edges, W, active, sampler, t)
        return edges, members

    def pair_request(self, state: CoBoState, edges: torch.Tensor) -> PairScores:
        """Eq. (1)'s scores of ``edges`` at their midpoints z_ij = (x_i + x_j) / 2."""
        return PairScores(edges, state.X, self.batches, self.cfg.alignment, self.floor(state))

    def round(self, state: CoBoState, t: int, ops: ClientOps) -> tuple[CoBoState, dict]:
        if self.cfg.order == "models_first":
            return self._models_first(state, t, ops)
        state, stats = run_plan(self, state, t, ops)
        del stats["alignments_applied"]  # a synchronous round applies its own
        return state, stats

    def _models_first(self, state: CoBoState, t: int, ops: ClientOps):
        """The authors' order: x^{t+1} from x^t with W^t (Eq. 3), then W^{t+1} from the
        scores at the midpoints of the new models (Eq. 1); two engine requests."""
        members = self.sample_edges(state.active, t, ops.n_clients, state.X.device)[1]
        G, L = ops.grads(members, state.X[members], t, rng.STEP, 0)
        stepped = self.step(state, members, G)
        state = self.faded(stepped, t)
        # the same edges: sampling depends on (seed, t) and W^t only
        edges = self.sample_edges(state.active, t, ops.n_clients, state.X.device, state.W)[0]
        if edges.shape[0]:
            # asked as plain rows on every engine (the local engine's fused shared points
            # would round this order's scores otherwise in the last bit)
            scores, _ = answer_rows(ops, self.pair_request(state, edges), t)
            state = self.apply_scores(state, edges, scores, t)
        return state, self.stats(L, edges.shape[0], members, stepped, state.X.shape[1])

    def apply_scores(self, state: CoBoState, edges, scores: torch.Tensor, t: int) -> CoBoState:
        """Eq. (1) from round t's scores of the sampled pairs."""
        step = self.step_in(state, t)
        return replace(state, W=update_weights(state.W, edges, scores, step, self.cfg.domain))

    def step(self, state: CoBoState, members: torch.Tensor, G: torch.Tensor) -> CoBoState:
        """Eq. (3) for the present clients with the current W. With ``momentum`` beta > 0
        (the authors' code) the gradient is replaced by its running average m <- beta m +
        (1 - beta) g (m = g at the first step); the penalty is not averaged."""
        beta, X, W, M = self.cfg.momentum, state.X, state.W, state.M
        if beta > 0:
            if M is None:
                M = torch.zeros_like(X)
                M[members] = G
            else:
                M = M.clone()
                M[members] = beta * M[members] + (1 - beta) * G
            G = M[members]
        n = X.shape[0]
        if state.active is None:
            X = self.pull.step(X, G, W, n)
        else:  # only the present clients step, pulled only toward each other
            X = X.clone()
            X[members] = self.pull.step(X[members], G, W[members][:, members], n)
        return replace(state, X=X, W=W, M=M)

    # -- the round as plan -> apply (PlansRounds: alignment results may arrive late) ---
    def plan_refusal(self) -> str | None:
        if self.cfg.order == "weights_first":
            return None
        return (
            "late alignment results need algorithm.order=weights_first (the models_first "
            "order waits for each round's W)"
        )

    def plan_round(self, state: CoBoState, t: int, ops: ClientOps) -> Plan:
        """Round t's requests: the pairs' scores ahead (Eq. 1 may take them late), the
        model step's gradients at x^t now."""
        X = state.X
        edges, members = self.sample_edges(state.active, t, ops.n_clients, X.device, state.W)
        ahead = self.pair_request(state, edges) if edges.shape[0] else None
        now = Gradients(members, X[members], rng.STEP, 0)
        return Plan(t, ahead, now, {"edges": edges, "members": members})

    def apply_round(
        self, state: CoBoState, plan: Plan, now: Answer | None, arrived: list[tuple[Plan, Answer]]
    ) -> tuple[CoBoState, dict]:
        """This round's fade, Eq. (1) from each arrived round's scores (at its own round's
        gamma), then Eq. (3) with this round's model-step gradients."""
        state = self.faded(state, plan.round)
        applied = 0
        for p, (scores, _) in arrived:
            state = self.apply_scores(state, p.keep["edges"], scores, p.round)
            applied += p.keep["edges"].shape[0]
        assert now is not None
        members = plan.keep["members"]
        state = self.step(state, members, now[0])
        E, d = plan.keep["edges"].shape[0], state.X.shape[1]
        stats = self.stats(now[1], E, members, state, d)
        stats["alignments_applied"] = float(applied)
        return state, stats

    def stats(self, step_loss, E: int, members: torch.Tensor, read: CoBoState, d: int) -> dict:
        """A round's statistics; ``read``: the state whose W the round's pull read. Its
        communication (float32 numbers of d-dimensional models): for each of the E scored
        pairs the two models to form the midpoint, one end's midpoint gradient to the
        other and the score back, 3d + 1; for the pull, one model per collaborator read."""
        cut = self.pull.threshold or None
        reads = weights.count_read(read.W, cut, members, read.active)
        return {
            "train_loss": float(step_loss.mean()),
            "edges": float(E),
            "alignment_grads": float(2 * E * self.batches),
            "clients": float(members.numel()),
            "pull_reads": float(reads),
            "bytes_sent": float(FLOAT * (E * (3 * d + 1) + reads * d)),
        }

    # -- results ----------------------------------------------------------------------
    def eval_params(self, state: CoBoState) -> torch.Tensor:
        return state.X

    def collaboration(self, state: CoBoState) -> torch.Tensor | None:
        return weights.dense(state.W, state.active)

    def cluster_agreement(self, state: CoBoState, clusters: list[int | None]) -> dict | None:
        """W against the true clusters (``base.cluster_agreement``'s figures; a sparse W
        without forming it) and, with a pull threshold, ``mass_pulled_inside``: the same
        share of each row's mass inside its cluster among the weights Eq. (3) reads."""
        W = state.W if weights.is_sparse(state.W) else self.collaboration(state)
        out = weights.agreement(W, clusters)
        if out and self.pull.threshold > 0:
            read = weights.agreement(self.pull.read(W), clusters)
            if "mass_inside" in read:
                out["mass_pulled_inside"] = read["mass_inside"]
        return out

    def artifacts(self, state: CoBoState) -> dict:
        """A sparse W is saved as its stored entries (collaboration_sparse.pt)."""
        return weights.artifacts(state.W)
