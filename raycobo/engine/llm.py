"""ClientOps for collaborative LoRA fine-tuning of a shared, frozen causal LM.

A point x_i is client i's flat LoRA parameter vector (nothing else collaborates). A
gradient request loads the requested point into the adapters with
``torch.func.functional_call`` (the base model is one module shared by all clients of
the process), runs the language-modelling loss on a minibatch of that client's own token
blocks and differentiates with respect to the LoRA parameters only. Rows are processed
one at a time: a client's forward pass is already a large batched computation.

Minibatches are hashes of (seed, round, stream, global client id, salt) like every other
engine; stream VAL draws from the client's validation blocks. LoRA dropout is seeded by
the same coordinates, so a request gives the same numbers wherever it runs.
"""

from __future__ import annotations

import torch

from raycobo import rng
from raycobo.algorithms.base import Evaluation, tensor_layout
from raycobo.config import Config, ConfigError
from raycobo.data.text import TextData


class LoRAOps:
    execution = None  # rows run one by one; nothing to plan

    def __init__(
        self,
        data: TextData,
        cfg: Config,
        device: str | torch.device = "cpu",
        client_ids: torch.Tensor | None = None,
        eval_batch: int = 16,
    ):
        from raycobo.models.llm import load_base_model, with_lora

        self.cfg = cfg
        self.seed = cfg.seed
        self.device = torch.device(device)
        self.n_clients = data.n_clients
        self.clusters = list(data.clusters)
        self.labels = list(data.clients)
        self.ids = (
            torch.arange(data.n_clients) if client_ids is None else torch.as_tensor(client_ids)
        )
        self.batch_size = cfg.batch_size
        self.eval_batch = eval_batch
        self.train = [b.to(self.device) for b in data.train]
        self.val = [b.to(self.device) for b in data.val]
        base = load_base_model(cfg.model, data.vocab_size, cfg.seed)
        self.model = with_lora(base, cfg.model, cfg.seed).to(self.device)
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        self.dim = sum(self.numels)
        self._x0 = torch.cat([p.detach().reshape(-1) for _, p in named]).to(self.device)
        self._sizes = torch.tensor([float(b.shape[0]) for b in self.train], device=self.device)

    # -- parameters --------------------------------------------------------------------------
    def initial_params(self) -> torch.Tensor:
        return self._x0.clone()

    def random_params(self, salt: int) -> torch.Tensor:
        """Fresh adapters: A ~ Kaiming-uniform (peft's init), B = 0, seeded by salt."""
        g = torch.Generator().manual_seed(int(rng.hash_ints(self.seed, rng.INIT, salt)))
        parts = []
        for name, shape in zip(self.names, self.shapes, strict=True):
            t = torch.zeros(shape)
            if "lora_A" in name:
                torch.nn.init.kaiming_uniform_(t, a=5**0.5, generator=g)
            parts.append(t.reshape(-1))
        return torch.cat(parts).to(self.device)

    def data_sizes(self) -> torch.Tensor:
        return self._sizes

    def param_layout(self) -> list[tuple[int, int, int]]:
        return tensor_layout(self.shapes)

    def _params(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        out, off = {}, 0
        for name, shape, k in zip(self.names, self.shapes, self.numels, strict=True):
            out[name] = z[off : off + k].view(shape)
            off += k
        return out

    def _lm_loss(self, z: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        out = torch.func.functional_call(
            self.model, self._params(z), (), {"input_ids": blocks, "labels": blocks}, strict=False
        )
        return out.loss

    # -- minibatches ----------------------------------------------------------------------------
    def _batch(self, c: int, round: int, stream: int, salt: int) -> torch.Tensor:
        pool = self.val[c] if stream == rng.VAL else self.train[c]
        k = torch.arange(self.batch_size)
        idx = rng.randint(
            torch.tensor(pool.shape[0]), self.seed, round, stream, int(self.ids[c]), salt, k
        )
        return pool[idx.to(pool.device)]

    def _dropout_seed(self, round: int, stream: int, c: int, salt: int) -> int:
        return int(rng.hash_ints(self.seed, round, stream, int(self.ids[c]), salt, 0xD0))

    def _rows(self, clients, Z, stream, salt):
        m = clients.numel()
        streams, salts = rng.per_row(stream, m), rng.per_row(salt, m)
        for k in range(m):
            yield k, int(clients[k]), int(streams[k]), int(salts[k])

    def grads(self, clients, Z, round, stream, salt=0):
        self.model.train(self.cfg.model.lora_dropout > 0)
        G = torch.empty(Z.shape[0], self.dim, dtype=Z.dtype, device=self.device)
        losses = torch.empty(Z.shape[0], dtype=Z.dtype, device=self.device)
        for k, c, s, a in self._rows(clients, Z, stream, salt):
            z = Z[k].detach().to(self.device).requires_grad_()
            with torch.random.fork_rng(devices=[]), torch.enable_grad():
                torch.manual_seed(self._dropout_seed(round, s, c, a))
                loss = self._lm_loss(z, self._batch(c, round, s, a))
                (g,) = torch.autograd.grad(loss, z)
            G[k], losses[k] = g, loss.detach()
        return G, losses

    def losses(self, clients, Z, round, stream, salt=0):
        self.model.eval()
        out = torch.empty(Z.shape[0], dtype=Z.dtype, device=self.device)
        with torch.no_grad():
            for k, c, s, a in self._rows(clients, Z, stream, salt):
                out[k] = self._lm_loss(Z[k].to(self.device), self._batch(c, round, s, a))
        return out

    def evaluate(self, clients: torch.Tensor, Z: torch.Tensor) -> Evaluation:
        """Mean token loss of client k's model on all of client k's validation blocks
        (perplexity = exp(loss))."""
        self.model.eval()
        out = torch.empty(Z.shape[0], device=self.device)
        with torch.no_grad():
            for k in range(Z.shape[0]):
                blocks = self.val[int(clients[k])]
                total = 0.0
                for a in range(0, blocks.shape[0], self.eval_batch):
                    part = blocks[a : a + self.eval_batch]
                    total += float(self._lm_loss(Z[k].to(self.device), part)) * part.shape[0]
                out[k] = total / blocks.shape[0]
        return Evaluation(loss=out, accuracy=None)

    def evaluate_mixture(self, clients, Z, weights) -> Evaluation:
        raise ConfigError(
            "invalid config key 'algorithm.name': a mixture of language models (FedeRiCo's "
            "prediction) is not implemented; use a method that predicts with one model per client"
        )
