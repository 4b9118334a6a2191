"""The interface between algorithms (pure math) and engines (where clients compute).

An algorithm keeps its state explicitly (a dataclass of tensors: models X, weights W,
...) and asks an engine, through :class:`ClientOps`, for the only things that need the
clients' data: stochastic gradients and losses of chosen clients at chosen points, and
test metrics. "Gradients of clients I at points Z" is the single primitive that CoBo's
alignment step, its model step and every baseline reduce to; an engine is free to batch
it (the local engine stacks all clients into one call) or to ship it to actors that hold
the data (the Ray engine).

Minibatches are drawn from counter-based hashes of (seed, round, client, stream, salt),
so two engines given the same request draw the same samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from raycobo import rng
from raycobo.algorithms import pairs
from raycobo.algorithms.pairs import PairScores


@dataclass
class Evaluation:
    """Per-client test metrics; ``accuracy`` is None for regression tasks."""

    loss: torch.Tensor  # (m,)
    accuracy: torch.Tensor | None  # (m,)


class ClientOps(Protocol):
    """What an engine offers an algorithm."""

    n_clients: int
    dim: int
    clusters: list[int | None]
    device: torch.device

    def initial_params(self) -> torch.Tensor:
        """The shared starting point x^0, shape (d,)."""
        ...

    def random_params(self, salt: int) -> torch.Tensor:
        """An independent random initialisation (d,), deterministic in (seed, salt)."""
        ...

    def data_sizes(self) -> torch.Tensor:
        """Training-set size of every client, shape (n,), float."""
        ...

    def param_layout(self) -> list[tuple[int, int, int]]:
        """The flat parameter vector as layers: (offset, channels, size per channel), in
        order, covering all d entries (meta-L2C encodes each channel of a layer)."""
        ...

    def grads(
        self,
        clients: torch.Tensor,
        Z: torch.Tensor,
        round: int,
        stream: torch.Tensor | int,
        salt: torch.Tensor | int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stochastic gradients of f_{clients[k]} at Z[k] on a fresh minibatch of that
        client's own data. ``stream`` (what the draw is for) and ``salt`` are an int or one
        per row, so requests of several kinds can share one call. Returns (G (m, d),
        losses (m,)). Z may be ``SharedPoints`` where the ops sets ``shares_points``: G
        then has its ``gradient_rows`` rows."""
        ...

    def losses(
        self,
        clients: torch.Tensor,
        Z: torch.Tensor,
        round: int,
        stream: int,
        salt: torch.Tensor | int = 0,
    ) -> torch.Tensor:
        """Minibatch losses of f_{clients[k]} at Z[k], shape (m,), no gradient."""
        ...

    def evaluate(self, clients: torch.Tensor, Z: torch.Tensor) -> Evaluation:
        """Test metrics of client k's model Z[k] on client k's test data."""
        ...

    def evaluate_mixture(
        self, clients: torch.Tensor, Z: torch.Tensor, weights: torch.Tensor
    ) -> Evaluation:
        """Test metrics of client k predicting with sum_j weights[k, j] p(y | x; Z[k, j])
        (FedeRiCo's mixture). Z: (m, k, d), weights: (m, k)."""
        ...


@runtime_checkable
class Algorithm(Protocol):
    """A collaborative-learning method over explicit state. What some methods can do
    besides is declared by the capability protocols below (``Elastic``,
    ``EvaluatesItself``, ``ExportsArtifacts``, ``KeepsOwnAgreement``,
    ``PlansRounds``, ``StepsInRows``, ``ScoresPairsInRows``)."""

    name: str

    def init(self, ops: ClientOps) -> Any: ...

    def round(self, state: Any, t: int, ops: ClientOps) -> tuple[Any, dict[str, float]]:
        """One synchronous round t (0-based). Returns the new state and round statistics."""
        ...

    def eval_params(self, state: Any) -> torch.Tensor:
        """The model each client predicts with, (n, d)."""
        ...

    def collaboration(self, state: Any) -> torch.Tensor | None:
        """The n x n collaboration matrix, or None when the method has none."""
        ...


# -- optional capabilities: an algorithm declares one by having its methods; the session
# checks with isinstance instead of probing attribute names.


@runtime_checkable
class Elastic(Protocol):
    """Clients may leave and join between rounds (CoBo Section 2, ``schedule``)."""

    def leave(self, state: Any, clients: list[int]) -> Any: ...

    def join(self, state: Any, clients: list[int], t: int) -> Any:
        """``clients`` join before round t (0-based)."""
        ...


def change_members(algo: Elastic, state: Any, kind: str, clients: list[int], t: int) -> Any:
    """``state`` after ``clients`` join before round t (``kind`` 'join') or leave."""
    if kind == "join":
        return algo.join(state, clients, t)
    return algo.leave(state, clients)


@runtime_checkable
class EvaluatesItself(Protocol):
    """Predicts with something other than one model per client (FedeRiCo's mixture)."""

    def evaluate(self, state: Any, ops: ClientOps) -> Evaluation: ...


# the part every method's state has, as SizesItsState names it
MODELS = "the clients' models (fewer clients or a smaller model)"


@runtime_checkable
class SizesItsState(Protocol):
    """Says what its state takes for n clients of d parameters, by part (bytes; each
    part named with the setting that shrinks it), so that an engine can refuse a run
    that cannot fit before allocating anything."""

    def state_bytes(self, n: int, d: int) -> dict[str, int]: ...


@runtime_checkable
class ExportsArtifacts(Protocol):
    """Learned extras saved beside the run (CoBo's sparse W, meta-L2C's encoder)."""

    def artifacts(self, state: Any) -> dict[str, Any]: ...


@runtime_checkable
class KeepsOwnAgreement(Protocol):
    """Computes the cluster agreement of W from its own (sparse) form."""

    def cluster_agreement(self, state: Any, clusters: list[int | None]) -> dict | None: ...


# -- a round as plan -> compute -> apply: what a method needs computed, named, so that an
# engine can compute it where the data lives and apply late results (bounded staleness)


@dataclass(frozen=True)
class Gradients:
    """A request: ``ops.grads(clients, points, round, stream, salt)`` -> (G (m, d), L (m,))."""

    clients: torch.Tensor  # (m,)
    points: torch.Tensor  # (m, d)
    stream: torch.Tensor | int
    salt: torch.Tensor | int = 0


@dataclass(frozen=True)
class LocalSGD:
    """A request: ``steps`` SGD steps of each client from its start point, step s on
    minibatch (stream, salt s): ``y <- y - lr (g + prox (y - anchor))``, the anchor the
    start unless given (``prox`` 0: plain SGD) -> (end points (m, d), the first step's
    losses (m,)). An engine that keeps the data apart (Ray) runs all the steps where the
    data is: one call instead of ``steps``."""

    clients: torch.Tensor  # (m,)
    start: torch.Tensor  # (m, d)
    lr: float
    steps: int
    stream: int
    prox: float = 0.0
    anchor: torch.Tensor | None = None  # (m, d) or (d,); None: the start


Request = Gradients | LocalSGD | PairScores
Answer = tuple[torch.Tensor, torch.Tensor]  # (G or end points (m, d), losses (m,))


@dataclass
class Plan:
    """Round ``round``'s requests: ``ahead``'s result may be applied up to
    ``engine.staleness`` rounds late (``engine.rounds: stale``), ``now``'s is needed by
    the round itself; ``keep`` holds what the method's apply reads besides (tensors and
    numbers: a plan in flight is checkpointed and sent again on resume). ``drain``: this
    round applies every ahead result still in flight, as the last round does (a method
    whose next phase needs them all, e.g. FedAvg-FT before fine-tuning)."""

    round: int
    ahead: Request | None = None
    now: Request | None = None
    keep: dict[str, Any] = field(default_factory=dict)
    drain: bool = False


@runtime_checkable
class PlansRounds(Protocol):
    """A round in parts, plan then apply, so that an engine can send the ``ahead``
    requests without waiting for them (``engine.rounds: stale`` on Ray). ``apply_round``
    gets the round's own ``now`` result and every ``ahead`` result that arrived, oldest
    plan first (in a synchronous round: this round's own). The method's synchronous
    ``round`` gives the numbers of :func:`run_plan` (it may compute them otherwise, as
    CoBo's one-call round does)."""

    def plan_round(self, state: Any, t: int, ops: ClientOps) -> Plan: ...

    def apply_round(
        self, state: Any, plan: Plan, now: Answer | None, arrived: list[tuple[Plan, Answer]]
    ) -> tuple[Any, dict[str, float]]: ...

    def plan_refusal(self) -> str | None:
        """Why these settings cannot take ahead results late (None: they can)."""
        ...


@runtime_checkable
class TrainsLocally(Protocol):
    """A ClientOps that runs :class:`LocalSGD` requests itself (Ray: in the hosts, one
    call for all the steps); other engines get :func:`sgd_steps` over ``grads``."""

    def local_sgd(self, request: LocalSGD, round: int) -> Answer: ...


def sgd_steps(ops: ClientOps, r: LocalSGD, t: int) -> Answer:
    """The steps of a :class:`LocalSGD` request of round t over ``ops.grads``."""
    Y = r.start.clone()
    anchor = r.start if r.anchor is None else r.anchor
    first_loss = None
    for s in range(r.steps):
        G, loss = ops.grads(r.clients, Y, t, r.stream, s)
        if r.prox:
            G = G + r.prox * (Y - anchor)
        Y -= r.lr * G
        if first_loss is None:
            first_loss = loss
    assert first_loss is not None
    return Y, first_loss


def compute(ops: ClientOps, request: Request, t: int) -> Answer:
    """One request of round t, computed before returning."""
    r = request
    if isinstance(r, Gradients):
        return ops.grads(r.clients, r.points, t, r.stream, r.salt)
    if isinstance(r, PairScores):
        return pairs.answer(ops, r, t)
    if isinstance(ops, TrainsLocally):
        return ops.local_sgd(r, t)
    return sgd_steps(ops, r, t)


def compute_plan(ops: ClientOps, plan: Plan, t: int) -> tuple[Answer | None, Answer | None]:
    """A plan's ``ahead`` and ``now`` answered in round t. Pair scores and gradients go
    to an ops that takes plain rows as one ``grads`` call where it holds them at once
    (one round trip where the clients are remote; each row's answer does not depend on
    the rows beside it)."""
    a, n = plan.ahead, plan.now
    if isinstance(a, PairScores) and isinstance(n, Gradients) and _merges(ops, a, n):
        clients, Z, salts = pairs.rows_of(a, extra=n.points)
        A, m = clients.numel(), n.clients.numel()
        dev = Z.device
        streams = torch.cat([torch.full((A,), rng.ALIGN), rng.per_row(n.stream, m).cpu()])
        salts = torch.cat([salts, rng.per_row(n.salt, m).to(salts.device)])
        rows = torch.cat([clients, n.clients])
        G, L = ops.grads(rows, Z, t, streams.to(dev), salts.to(dev))
        del Z  # the points go before the scores' minibatch mean is made
        return (pairs.scores_from(a, G[:A]), L[:0]), (G[A:], L[A:])
    return (
        None if a is None else compute(ops, a, t),
        None if n is None else compute(ops, n, t),
    )


def _merges(ops: ClientOps, a: PairScores, n: Gradients) -> bool:
    """Whether pair scores ``a`` and gradients ``n`` go to ``ops`` as one request."""
    held = pairs.held_rows(ops)
    fits = held is None or a.rows + n.clients.numel() <= held
    return fits and not pairs.shares_points(ops)


def run_plan(algo: PlansRounds, state: Any, t: int, ops: ClientOps) -> tuple[Any, dict]:
    """A synchronous round as plan -> compute -> apply (what ``engine.rounds: stale``
    computes with ``engine.staleness: 0``)."""
    plan = algo.plan_round(state, t, ops)
    ahead, now = compute_plan(ops, plan, t)
    return algo.apply_round(state, plan, now, [] if ahead is None else [(plan, ahead)])


@runtime_checkable
class StepsInRows(Protocol):
    """A round that hosts, each keeping some clients' models (rows of X) and their rows
    of a weight matrix W, compute between them (the Ray engine's ``engine.rounds:
    resident``). The coordinator keeps the method's *rows state*: its state without the
    models, which has ``W`` (n, n) and ``active`` ((n,) bool or None: every client
    present). Each round t, every present client steps:

    1. every host computes its present clients' gradients at their models; with the
       round's ``row_step(t, state)`` (one object, sent to every host) ``published(X,
       members, G)`` gives the models the other hosts read in phase 2 (None: x^t; used
       where ``reads_published``);
    2. every host steps its present clients' rows, ``step(X_rows, G, Y_rows, W_rows,
       blocks)``, over the models of the hosts its W rows read (``rows_read``: (cols,
       models) blocks of x^t, or of the published models, ``Y_rows`` this host's);
    3. ``stats(losses, E, members, state, d)`` gives the round's statistics (E: the
       pairs scored, 0 without; ``state``: the rows state the step read; d: the
       model's size, for its communication).

    ``rows_start(ops)`` gives W^0 and the extras the rows state keeps (checkpointed by
    name); ``rows_state(W, active, extras)`` builds it and ``rows_extras(state)`` gives
    a state's extras back (after a membership change that may set some);
    ``updates_whole_rows`` says whether a round may change every entry of a row it
    touches (a projection onto the simplex), not only its own pairs'; ``rows_refusal``
    why the method's settings cannot run so (None: they can). A method whose W learns
    from scored pairs is also ``ScoresPairsInRows``."""

    def rows_start(self, ops: ClientOps) -> tuple[torch.Tensor, dict[str, Any]]: ...

    def rows_state(self, W: torch.Tensor, active: torch.Tensor | None, extras: dict) -> Any: ...

    def rows_extras(self, state: Any) -> dict[str, Any]: ...

    def row_step(self, t: int, state: Any) -> Any: ...

    def rows_read(self, W: torch.Tensor) -> torch.Tensor: ...

    def updates_whole_rows(self) -> bool: ...

    def stats(
        self, step_loss: torch.Tensor, E: int, members: torch.Tensor, state: Any, d: int
    ) -> dict[str, float]: ...

    def present(self, state: Any) -> int: ...

    def rows_refusal(self) -> str | None: ...


@runtime_checkable
class ScoresPairsInRows(Protocol):
    """A rows method whose W learns from pair scores (``pairs.PairScores``) each round:

    - ``round_pairs(active, t, n, W)`` -> round t's pairs (E, 2), i < j, among the
      present clients (possibly none), and ``samples_from_w(t, n)``: whether they read
      W^t (then round t is sampled only once round t - 1's W is in);
    - in phase 1 each host also computes, for the pairs whose i or j end it holds, that
      end's gradient at the pair's point ``row_step.points(X_own, X_partner)``, the mean
      of ``row_step.batches`` minibatches (stream ALIGN, salted by the partner, as
      ``pairs.rows_of`` draws them);
    - in phase 2 each host scores the pairs that touch it (``row_step.score`` with
      ``row_step.floor``, ``pairs.alignment_scores``) and updates its W rows,
      ``row_step.update_rows(W_rows, ids, edges, scores)``, every round (with no pair
      too: an update may act on every row, as CoBo's fade), before its step;
    - the coordinator keeps its W in step with the hosts': ``rows_update(state,
      edges, scores, t)``, every round."""

    def round_pairs(
        self, active: torch.Tensor | None, t: int, n: int, W: torch.Tensor
    ) -> torch.Tensor: ...

    def samples_from_w(self, t: int, n: int) -> bool: ...

    def rows_update(self, state: Any, edges: torch.Tensor, scores: torch.Tensor, t: int) -> Any: ...


def evaluate(algo: Algorithm, state: Any, ops: ClientOps) -> Evaluation:
    """Every client's prediction model on its own test data (or the algorithm's own
    evaluation, for one that predicts otherwise)."""
    if isinstance(algo, EvaluatesItself):
        return algo.evaluate(state, ops)
    clients = torch.arange(ops.n_clients, device=ops.device)
    params = algo.eval_params(state)
    expect(algo, "eval_params", params, (ops.n_clients, ops.dim))
    return ops.evaluate(clients, params)


def expect(algo: Any, member: str, value: Any, shape: tuple[int, ...]) -> None:
    """A method's answer of the wrong kind or shape, named (a plugin's mistake would
    otherwise surface as torch's text from deep inside an engine)."""
    if isinstance(value, torch.Tensor) and tuple(value.shape) == shape:
        return
    got = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
    raise TypeError(f"{_label(algo)}.{member} returned {got}; expected a tensor of shape {shape}")


def round_result(algo: Any, out: Any) -> tuple[Any, dict[str, float]]:
    """``algo.round``'s answer, checked: (new state, statistics as a dict)."""
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise TypeError(
            f"{_label(algo)}.round returned {type(out).__name__}; expected (state, dict of "
            "round statistics)"
        )
    return out


def _label(algo: Any) -> str:
    return getattr(algo, "name", type(algo).__name__)


def all_clients(ops: ClientOps) -> torch.Tensor:
    return torch.arange(ops.n_clients, device=ops.device)


def tensor_layout(shapes: list[tuple[int, ...]] | list[torch.Size]) -> list[tuple[int, int, int]]:
    """param_layout of a model's parameter tensors: a tensor of rank >= 2 is shape[0]
    channels (output units / filters), a vector is one channel."""
    out, offset = [], 0
    for shape in shapes:
        numel = 1
        for s in shape:
            numel *= int(s)
        channels = int(shape[0]) if len(shape) >= 2 else 1
        out.append((offset, channels, numel // channels))
        offset += numel
    return out


def cluster_agreement(W: torch.Tensor | None, clusters: list[int | None]) -> dict[str, float]:
    """Mean off-diagonal W inside (``w_within``) and across (``w_across``) the
    ground-truth clusters, and ``mass_inside``: the share of each row's off-diagonal mass
    |w_ij| inside its cluster (many small cross weights add up; a signed matrix, such as
    FedFomo's affinity or APPLE's relationships, by the weights' size), averaged over
    rows with mass; empty without W, without clusters or with one client."""
    if W is None or any(c is None for c in clusters) or W.shape[0] < 2:
        return {}
    cl = torch.tensor(clusters)
    same = cl[:, None] == cl[None, :]
    off = ~torch.eye(len(cl), dtype=torch.bool)
    Wc = W.detach().float().cpu()
    out = {}
    if (same & off).any():
        out["w_within"] = float(Wc[same & off].mean())
    if (~same).any():
        out["w_across"] = float(Wc[~same].mean())
    Wa = Wc.abs()
    out.update(mass_inside(Wa.sum(1) - Wa.diagonal(), (Wa * (same & off)).sum(1)))
    return out


def agreement_of(
    algo: Any, state: Any, W: torch.Tensor | None, clusters: list[int | None]
) -> dict[str, float]:
    """W's agreement with the true clusters as the algorithm reports it
    (``KeepsOwnAgreement``: a sparse W, the share the pull reads), else
    ``cluster_agreement`` of the dense ``W``."""
    if isinstance(algo, KeepsOwnAgreement):
        own = algo.cluster_agreement(state, clusters)
        if own is not None:
            return own
    return cluster_agreement(W, clusters)


def mass_inside(total: torch.Tensor, inside: torch.Tensor) -> dict[str, float]:
    """{"mass_inside": mean of inside / total over the rows with total > 0} (or {})."""
    has = total > 0
    if not bool(has.any()):
        return {}
    return {"mass_inside": float((inside[has] / total[has]).double().mean())}
