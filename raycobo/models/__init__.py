"""Models as functions of a flat parameter vector, batched over clients.

Every model is an ``nn.Module`` (for the per-client reference loop and for users) plus a
*batched functional* form: ``forward(P, x)`` with ``P`` of shape (m, d) -- one flat
parameter vector per client -- and ``x`` of shape (m, B, *input_shape), returning logits
(m, B, C). The flat layout is ``torch.cat([p.flatten() for p in module.parameters()])``.

The MLP has a hand-batched path (``baddbmm`` per layer: one kernel for all clients);
other models use ``torch.func.vmap`` over ``functional_call``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call, vmap

from raycobo.config import ConfigError, ModelConfig
from raycobo.registry import Registry


class MLP(nn.Module):
    """Fully connected ReLU network: in -> hidden... -> classes."""

    def __init__(self, in_features: int, hidden: list[int], num_classes: int):
        super().__init__()
        sizes = [in_features, *hidden, num_classes]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:], strict=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.flatten(1)
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = torch.relu(h)
        return h


@dataclass
class FunctionalModel:
    """A module template plus its flat-parameter batched forward."""

    name: str
    module: nn.Module
    input_shape: tuple[int, ...]
    num_classes: int
    names: list[str] = field(init=False)
    shapes: list[torch.Size] = field(init=False)
    dim: int = field(init=False)
    # forward over per-parameter blocks [(m, numel_k)], for models with a hand-batched path
    _batched_parts: Callable[[list[torch.Tensor], torch.Tensor], torch.Tensor] | None = None
    # optional fused cross-entropy loss + gradient: (P, x, y, G_out) -> losses (m,)
    loss_grad: Callable[..., torch.Tensor] | None = None
    # optional pair scores' inner products from per-sample factors (``PairGrams``)
    pair_grams: PairGrams | None = None

    def __post_init__(self) -> None:
        named = list(self.module.named_parameters())
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.dim = sum(p.numel() for _, p in named)
        self._buffers = dict(self.module.named_buffers())
        bounds = [0]
        for shape in self.shapes:
            bounds.append(bounds[-1] + math.prod(shape))
        self.segments = list(zip(bounds[:-1], bounds[1:], strict=True))

    def init_flat(self, seed: int) -> torch.Tensor:
        """The shared initial point x^0 (d,), deterministic in ``seed``."""
        g = torch.random.fork_rng(devices=[])
        with g:
            torch.manual_seed(seed)
            for m in self.module.modules():
                if hasattr(m, "reset_parameters") and m is not self.module:
                    m.reset_parameters()
            return torch.cat([p.detach().flatten() for p in self.module.parameters()]).clone()

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of a flat vector (d,) as the module's named parameters."""
        out, off = {}, 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            n = math.prod(shape)
            out[name] = flat[off : off + n].view(shape)
            off += n
        return out

    def load_into(self, module: nn.Module, flat: torch.Tensor) -> None:
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(flat, module.parameters())

    def split(self, P: torch.Tensor) -> list[torch.Tensor]:
        """P (m, d) -> one contiguous (m, numel_k) block per parameter tensor.

        Differentiating with respect to these blocks (rather than slices of P) keeps
        autograd from materialising an (m, d) zero gradient per parameter."""
        return [P[:, a:b].contiguous() for a, b in self.segments]

    def forward_parts(self, parts: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Logits (m, B, C) from per-parameter blocks (see ``split``)."""
        if self._batched_parts is not None:
            return self._batched_parts(parts, x)
        return self.forward(torch.cat(parts, dim=1), x)

    def forward(self, P: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Logits (m, B, C) for parameters P (m, d) and inputs x (m, B, *input_shape)."""
        if self._batched_parts is not None:
            return self._batched_parts([P[:, a:b] for a, b in self.segments], x)

        def one(p: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
            params = self.unflatten(p)
            return functional_call(self.module, (params, self._buffers), (xb,))

        return vmap(one)(P, x)


def _mlp_batched(sizes: list[int]) -> Callable[[list[torch.Tensor], torch.Tensor], torch.Tensor]:
    layers = list(zip(sizes, sizes[1:], strict=False))

    def forward(parts: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        m, B = x.shape[0], x.shape[1]
        h = x.reshape(m, B, -1)  # (m, B, in)
        for i, (a, b) in enumerate(layers):
            W = parts[2 * i].view(m, b, a)  # (m, out, in), nn.Linear layout
            bias = parts[2 * i + 1].view(m, 1, b)  # (m, 1, out)
            h = torch.baddbmm(bias, h, W.transpose(1, 2))  # (m, B, out)
            if i < len(layers) - 1:
                h = torch.relu(h)
        return h

    return forward


def mlp_layers(sizes: list[int]) -> list[tuple[int, int, int, int, int]]:
    """Each layer of the MLP ``sizes`` in its flat parameter vector: (weight start, bias
    start, end, in, out), nn.Linear's layout."""
    layers, off = [], 0
    for a, b in zip(sizes, sizes[1:], strict=False):
        layers.append((off, off + a * b, off + a * b + b, a, b))
        off += a * b + b
    return layers


def _mlp_loss_grad(sizes: list[int]) -> Callable[..., torch.Tensor]:
    """Mean cross-entropy per request row and its gradient, written into G (m, d) in place.

    A hand-written backward for the batched MLP: every weight gradient is one batched
    GEMM written straight into its block of G (no autograd graph, no (m, d) temporaries).
    ``R`` requests per point: P (U, d) holds U points and the m = U R rows of x (m, B,
    ...), y (m, B) and G are point-major (rows u R .. u R + R - 1 at P[u]); the forward
    and the backward through the weights then run one GEMM of R B samples per point,
    reading one copy of it, and only the weight gradients stay per row. Each row's numbers
    are those of R = 1 on R copies of its point (the same per-row products: tested).
    ``means`` consecutive rows of a point (R a multiple of it) may share one gradient,
    their minibatches' mean, written as one row of G (m / means, d): each weight gradient
    one GEMM over their means B samples (where the per-row gradients and their mean
    would be means GEMMs and a pass over them); the loss stays per row (m,). Checked
    against autograd in tests/models."""
    layers = mlp_layers(sizes)

    def loss_grad(
        P: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        G: torch.Tensor,
        R: int = 1,
        means: int = 1,
    ) -> torch.Tensor:
        m, B = x.shape[0], x.shape[1]
        U, rows, S = m // R, m // means, means * B  # points, gradient rows, samples per row
        acts, h = _mlp_forward(layers, P, x.reshape(U, R * B, -1))  # inputs of each layer
        logp = torch.log_softmax(h, dim=-1)  # (U, R B, C)
        nll = -logp.gather(-1, y.reshape(U, R * B)[..., None]).squeeze(-1)
        loss = nll.view(m, B).mean(dim=1)  # (m,)
        delta = logp.exp_()  # dL/dlogits = (softmax - onehot) / (means B)
        delta.scatter_add_(
            -1, y.reshape(U, R * B)[..., None], torch.full_like(delta[..., :1], -1.0)
        )
        delta /= S
        for i in range(len(layers) - 1, -1, -1):
            w0, b0, end, a, b = layers[i]
            per = delta.view(rows, S, b)  # each gradient row's own
            out = G[:, w0:b0].view(rows, b, a)
            torch.bmm(per.transpose(1, 2), acts[i].view(rows, S, a), out=out)
            G[:, b0:end] = per.sum(dim=1)
            if i > 0:
                W = P[:, w0:b0].view(U, b, a)
                delta = torch.bmm(delta, W) * (acts[i] > 0)  # (U, R B, in)
        return loss

    return loss_grad


class PairGrams:
    """Pair scores' inner products from the MLP's per-sample factors, no gradient written.

    A layer's weight gradient over S samples is D^T A (D: the loss's derivatives at its
    outputs, A: its inputs, a row per sample), so the inner product of two such gradients
    is sum((D_i D_j^T) * (A_i A_j^T + 1)) (the + 1: the bias), summed over the layers:
    S x S products instead of the rows of d floats ``loss_grad`` writes and the score then
    reads. Called with P (U, d) points, each asked by a pair's two ends, and x (2 k U, B,
    ...), y (2 k U, B) point-major (the point's end i's k minibatches, then end j's: its
    ``SharedPoints`` rows) -> (U, 3): <g_i, g_j>, ||g_i||^2, ||g_j||^2, each g the mean
    gradient of its end's k B samples. ``pays`` says where this is the cheaper way."""

    def __init__(self, sizes: list[int]):
        self.layers = mlp_layers(sizes)

    def pays(self, samples: int) -> bool:
        """Whether for ends of ``samples`` samples the factors' three S x S products a
        layer take fewer multiply-adds than its two weight gradients (at 784-64-10 and S
        = 64 they take 1.7 times as many; at 784-128-10 about as many; measured:
        benchmarks/gram_scores.py)."""
        S = samples
        factors = sum(3 * S * S * (a + b) for *_, a, b in self.layers)
        written = sum(2 * S * (a * b + b) for *_, a, b in self.layers)
        return factors < written

    def __call__(self, P: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        U, S = P.shape[0], x.shape[0] * x.shape[1] // (2 * P.shape[0])
        acts, h = _mlp_forward(self.layers, P, x.reshape(U, 2 * S, -1))
        delta = torch.log_softmax(h, dim=-1).exp_()  # (softmax - onehot) / S
        delta.scatter_add_(-1, y.reshape(U, 2 * S, 1), torch.full_like(delta[..., :1], -1.0))
        delta /= S
        out = P.new_zeros(3, U)
        one = P.new_ones(1, 1, 1)
        for i in range(len(self.layers) - 1, -1, -1):
            A, D = acts[i].view(U, 2, S, -1), delta.view(U, 2, S, -1)
            for row, (p, q) in enumerate(((0, 1), (0, 0), (1, 1))):
                KA = torch.baddbmm(one, A[:, p], A[:, q].transpose(1, 2))
                KD = torch.bmm(D[:, p], D[:, q].transpose(1, 2))
                out[row] += torch.linalg.vecdot(KA.view(U, -1), KD.view(U, -1))
            if i > 0:
                w0, b0, _, a, b = self.layers[i]
                delta = torch.bmm(delta, P[:, w0:b0].view(U, b, a)) * (acts[i] > 0)
        return out.T


def _mlp_forward(layers, P: torch.Tensor, h: torch.Tensor):
    """The batched MLP at points P (U, d) on h (U, n, in): (every layer's inputs, logits)."""
    U, acts = P.shape[0], [h]
    for i, (w0, b0, end, a, b) in enumerate(layers):
        W = P[:, w0:b0].view(U, b, a)  # (U, out, in)
        h = torch.baddbmm(P[:, b0:end].view(U, 1, b), h, W.transpose(1, 2))  # (U, n, out)
        if i < len(layers) - 1:
            h = h.clamp_min_(0)
            acts.append(h)
    return acts, h


def build_mlp(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> FunctionalModel:
    in_features = math.prod(input_shape)
    module = MLP(in_features, list(cfg.hidden), num_classes)
    fm = FunctionalModel("mlp", module, tuple(input_shape), num_classes)
    fm._batched_parts = _mlp_batched([in_features, *cfg.hidden, num_classes])
    fm.loss_grad = _mlp_loss_grad([in_features, *cfg.hidden, num_classes])
    fm.pair_grams = PairGrams([in_features, *cfg.hidden, num_classes])
    return fm


def _conv(name: str) -> Callable[[ModelConfig, tuple[int, ...], int], FunctionalModel]:
    def build(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> FunctionalModel:
        from raycobo.models.vision import CNN, CNN1d, FedAvgCNN, ResNet9

        shape = tuple(input_shape)
        if name == "cnn1d":
            if len(shape) != 2:
                raise ConfigError(
                    f"invalid config key 'model.name': cnn1d needs 1-D inputs, got {shape}"
                )
            module = CNN1d(shape, num_classes)
        elif name == "fedavg_cnn":
            if len(shape) != 3 or min(shape[1:]) < 16:
                raise ConfigError(
                    f"invalid config key 'model.name': fedavg_cnn needs CxHxW images with H, W "
                    f"at least 16, got {shape}"
                )
            module = FedAvgCNN(shape, num_classes)
        else:
            if len(shape) != 3 or shape[1] % 4 or shape[2] % 4:
                raise ConfigError(
                    f"invalid config key 'model.name': {name} needs CxHxW images with H, W "
                    f"divisible by 4, got {shape}"
                )
            module = (
                CNN(shape, num_classes) if name == "cnn" else ResNet9(shape, num_classes, cfg.norm)
            )
        return FunctionalModel(name, module, shape, num_classes)

    return build


MODELS = Registry("model", "model.name")
for _name, _build in {
    "mlp": build_mlp,
    "cnn": _conv("cnn"),
    "fedavg_cnn": _conv("fedavg_cnn"),
    "cnn1d": _conv("cnn1d"),
    "resnet9": _conv("resnet9"),
}.items():
    MODELS.add(_name, _build)
# causal language models, built by the language-model engine (raycobo.engine.llm)
LANGUAGE_MODELS = ("smollm2", "hf", "tiny_gpt2")


def build_model(
    cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int
) -> FunctionalModel:
    """A built-in model, or a plugin: an ``nn.Module`` class (or a function returning a
    module) called as ``Net(input_shape, num_classes, **model.options)``."""
    if cfg.name in MODELS:
        if cfg.options:
            raise ConfigError(
                f"invalid config key 'model.options': {cfg.name} is a built-in model; options "
                "are the constructor arguments of a plugin model"
            )
        return MODELS.get(cfg.name)(cfg, input_shape, num_classes)
    if cfg.name in LANGUAGE_MODELS:
        raise ConfigError(
            f"invalid config key 'model.name': {cfg.name} is a language model "
            "(data.name: multilingual_text)"
        )
    factory = MODELS.get(cfg.name)
    if not callable(factory):
        raise ConfigError(f"invalid config key 'model.name': '{cfg.name}' is not callable")
    try:
        module = factory(tuple(input_shape), num_classes, **cfg.options)
    except TypeError as err:
        raise ConfigError(
            f"invalid config key 'model.options': {cfg.name}(input_shape, num_classes, "
            f"**options) failed: {err}"
        ) from None
    if not isinstance(module, nn.Module):
        raise ConfigError(
            f"invalid config key 'model.name': {cfg.name} built a {type(module).__name__}, "
            "not a torch.nn.Module"
        )
    return FunctionalModel(cfg.name, module, tuple(input_shape), num_classes)
