"""The in-process engine: all clients in one process, batched across clients.

``VectorizedOps`` answers "gradients of clients I at points Z" with one batched forward
and backward over all requested (client, point) pairs: the parameters are a stacked
(m, d) tensor, the minibatches an (m, B, ...) gather from one shared feature pool, and
autograd of the summed per-client losses yields every client's gradient at once (the
clients' losses are independent, so d(sum)/dZ_k = grad f_k(Z_k)).

``LoopOps`` is the same interface as a plain per-client PyTorch loop (an nn.Module per
call, one client at a time). It draws the same minibatches and serves as the reference
in engine-equivalence tests and as the baseline of ``raycobo bench``.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from raycobo import rng
from raycobo.algorithms import pairs
from raycobo.algorithms.base import Evaluation, tensor_layout
from raycobo.algorithms.pairs import SharedPoints
from raycobo.data.base import FederatedData
from raycobo.engine.memory import Execution
from raycobo.models import FunctionalModel


class ClientBatches:
    """Minibatch sampling for many clients from a shared feature pool (hash-seeded)."""

    def __init__(
        self,
        data: FederatedData,
        batch_size: int,
        seed: int,
        device: torch.device,
        client_ids: torch.Tensor | None = None,
        augment: bool = False,
    ):
        self.seed = seed
        self.augment = augment and data.train_x.dim() == 4
        # global ids used in the hash, so a host of a subset draws the same batches
        n = data.n_clients
        self.ids = torch.arange(n) if client_ids is None else torch.as_tensor(client_ids)
        self.batch_size = batch_size
        self.device = device
        full = torch.tensor(data.train_sizes(), dtype=torch.int64)  # (n,)
        if int(full.min()) == 0:
            empty = int(torch.nonzero(full == 0)[0])
            raise ValueError(f"client {empty} has no training data")
        # the last val_sizes[c] samples of client c are its validation part (stream VAL)
        self.val_sizes = torch.tensor(data.validation_sizes(), dtype=torch.int64)
        self.sizes = full - self.val_sizes  # what the training streams draw from
        self.offsets = torch.cumsum(full, 0) - full  # (n,)
        self.rows = torch.cat(data.train_idx).to(device)  # (sum n_c,) feature rows
        self.labels = torch.cat(data.train_y).to(device)  # (sum n_c,)
        self.x = data.train_x.to(device)

    def _keys(self, clients: torch.Tensor, round: int, stream, salt) -> tuple:
        """Hash coordinates of every sample of the batch: (seed, round, stream, global
        client id, salt, k), broadcasting to (m, B)."""
        c = clients.cpu().reshape(-1, 1)
        k = torch.arange(self.batch_size).reshape(1, -1)
        return (self.seed, round, rng.column(stream), self.ids[c], rng.column(salt), k)

    def positions(
        self, clients: torch.Tensor, round: int, stream, salt: torch.Tensor | int
    ) -> torch.Tensor:
        """Positions into the concatenated client arrays, (m, B). ``stream`` and ``salt``
        are ints or one per row (requests of several kinds in one call)."""
        c = clients.cpu().reshape(-1, 1)
        val = torch.as_tensor(stream).cpu().reshape(-1, 1) == rng.VAL  # (m, 1) or (1, 1)
        size = torch.where(val, self.val_sizes[c], self.sizes[c])
        if not bool(val.any()):
            size = self.sizes[c]
        elif int(size.min()) == 0:
            raise ValueError(
                "a validation draw needs held-out data: set data.validation_fraction > 0"
            )
        start = self.offsets[c] + torch.where(val, self.sizes[c], 0)
        draw = rng.randint(size, *self._keys(clients, round, stream, salt))  # (m, B)
        return (start + draw).to(self.device)

    def batch(
        self, clients: torch.Tensor, round: int, stream, salt: torch.Tensor | int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pos = self.positions(clients, round, stream, salt)
        # one row copy per sample (index_select is a plain gather of whole rows)
        xb = self.x.index_select(0, self.rows[pos].flatten()).view(*pos.shape, *self.x.shape[1:])
        if self.augment:
            from raycobo.data.augment import crop_flip

            xb = crop_flip(xb, self._keys(clients, round, stream, salt))
        return xb, self.labels[pos]  # (m, B, ...), (m, B)


class _SupervisedBase:
    def __init__(
        self,
        data: FederatedData,
        model: FunctionalModel,
        batch_size: int,
        seed: int,
        execution: Execution,
        device: str | torch.device = "cpu",
        client_ids: torch.Tensor | None = None,
        augment: bool = False,
    ):
        """``execution``: how calls are batched and bounded (``engine.memory``'s plan,
        made by ``raycobo.engine.make_local_ops``)."""
        self.data = data
        self.model = model
        self.seed = seed
        self.execution = execution
        self.device = torch.device(device)
        self.n_clients = data.n_clients
        self.dim = model.dim
        self.clusters = list(data.clusters)
        self.batches = ClientBatches(data, batch_size, seed, self.device, client_ids, augment)
        self._x0 = model.init_flat(seed).to(self.device)
        self._sizes = self.batches.sizes.to(torch.float32).to(self.device)
        self.test_x = data.test_x.to(self.device)
        self.test_idx = [t.to(self.device) for t in data.test_idx]
        self.test_y = [t.to(self.device) for t in data.test_y]
        self.bf16 = execution.precision == "bf16"
        # the gradient rows one request may hold (pair scores beyond it: in parts)
        self.request_rows = execution.request_rows
        # TF32 tensor cores for matmuls and convolutions with tf32 only. Set both ways, since
        # the switches are process-wide: PyTorch's own default runs convolutions in TF32,
        # so "fp32" would not be fp32 on a GPU, and a tf32 run would leak into the next.
        tf32 = execution.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32

    def autocast(self):
        """bf16 autocast (engine.precision=bf16): the passes in bfloat16, parameters,
        gradients and losses in float32; a no-op otherwise."""
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def initial_params(self) -> torch.Tensor:
        return self._x0.clone()

    def random_params(self, salt: int) -> torch.Tensor:
        return self.model.init_flat(int(rng.hash_ints(self.seed, rng.INIT, salt))).to(self.device)

    def data_sizes(self) -> torch.Tensor:
        return self._sizes

    def param_layout(self) -> list[tuple[int, int, int]]:
        return tensor_layout(self.model.shapes)


class VectorizedOps(_SupervisedBase):
    """Batched ClientOps for supervised tasks; ``execution`` (engine.memory) bounds the
    client rows of one call and the test samples of one evaluation call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.chunk_size = self.execution.rows_per_call
        self.eval_rows = self.execution.eval_rows
        self.eval_block = self.execution.eval_block
        # the hand-written fp32 backward (the MLP): a request's rows that share a point
        # run as one GEMM on one copy of it (``SharedPoints``)
        self.fused = self.model.loss_grad is not None and not self.bf16
        self.shares_points = self.fused
        # pair scores of shared points are asked in parts of one call's rows
        self.shared_part_rows = self.chunk_size if self.shares_points else None

    def _chunks(self, m: int):
        for a in range(0, m, self.chunk_size):
            yield slice(a, min(m, a + self.chunk_size))

    def _loss(self, P, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """Mean minibatch loss per client; P is (m, d) or a list of parameter blocks."""
        if isinstance(P, list):
            logits = self.model.forward_parts(P, xb)  # (m, B, C)
        else:
            logits = self.model.forward(P, xb)
        m, B, C = logits.shape
        per = F.cross_entropy(logits.reshape(m * B, C), yb.reshape(m * B), reduction="none")
        return per.view(m, B).mean(dim=1)  # (m,)

    def _shared_grads(self, clients, Z: SharedPoints, round, streams, salts):
        """``grads`` of a request whose rows share points: per segment, chunks of whole
        points (at most ``rows_per_call`` rows), each point's R rows in one GEMM and each
        run of ``Z.means`` rows as one gradient."""
        m, k = clients.numel(), Z.means
        G = torch.empty(Z.gradient_rows, self.dim, device=self.device, dtype=Z.dtype)
        L = torch.empty(m, device=self.device, dtype=Z.dtype)
        row = 0
        for values, R in Z.segments:
            step = max(1, self.chunk_size // R)  # points per call
            for u in range(0, values.shape[0], step):
                P = values[u : u + step].detach()
                a, b = row + u * R, row + (u + P.shape[0]) * R
                xb, yb = self.batches.batch(clients[a:b], round, streams[a:b], salts[a:b])
                L[a:b] = self.model.loss_grad(P, xb, yb, G[a // k : b // k], R, k)
            row += values.shape[0] * R
        return G, L

    def scores_by_grams(self, batches: int) -> bool:
        """Whether pair scores of ends of ``batches`` minibatches are cheaper from the
        model's per-sample factors (``pair_grams``) than from written gradients. Not for
        one minibatch an end: there the shared points give the plain rows' scores bit for
        bit (``SharedPoints``), as every engine computes them."""
        grams = self.model.pair_grams
        samples = batches * self.batches.batch_size
        return batches > 1 and self.fused and grams is not None and grams.pays(samples)

    def pair_grams(self, clients, Z: SharedPoints, round, stream, salt=0) -> torch.Tensor:
        """For each point of ``Z`` (one segment of 2k rows a point: end i's k minibatches,
        then end j's; ``pairs.shared_rows``) the inner products <g_i, g_j>, ||g_i||^2 and
        ||g_j||^2 of its two ends' gradients, each the mean of its k minibatches', from
        the model's per-sample factors: no gradient is written. -> (U, 3)"""
        m = clients.numel()
        salts, streams = rng.per_row(salt, m), rng.per_row(stream, m)
        ((values, R),) = Z.segments
        out = values.new_empty(values.shape[0], 3)
        # calls of whole points, none of one point but a lone point's own: a reduction
        # over one row may split between threads (``pairs.pair_parts``)
        for u, v in pairs.pair_parts(values.shape[0], self.chunk_size // R):
            a, b = u * R, v * R
            xb, yb = self.batches.batch(clients[a:b], round, streams[a:b], salts[a:b])
            out[u:v] = self.model.pair_grams(values[u:v].detach(), xb, yb)
        return out

    def grads(self, clients, Z, round, stream, salt=0):
        m = clients.numel()
        salts, streams = rng.per_row(salt, m), rng.per_row(stream, m)
        if isinstance(Z, SharedPoints):
            if Z.rows != m:
                raise ValueError(f"{m} request rows for {Z.rows} shared-point rows")
            if self.fused:
                return self._shared_grads(clients, Z, round, streams, salts)
            G, L = self.grads(clients, Z.materialize(), round, streams, salts)
            return pairs.mean_of_runs(G, Z.means), L
        G = torch.empty(m, self.dim, device=self.device, dtype=Z.dtype)
        L = torch.empty(m, device=self.device, dtype=Z.dtype)
        for sl in self._chunks(m):
            xb, yb = self.batches.batch(clients[sl], round, streams[sl], salts[sl])
            if self.fused:  # the hand-written fp32 backward
                L[sl] = self.model.loss_grad(Z[sl].detach(), xb, yb, G[sl])
                continue
            with torch.enable_grad():
                parts = [p.requires_grad_(True) for p in self.model.split(Z[sl].detach())]
                with self.autocast():
                    loss = self._loss(parts, xb, yb)
                grads = torch.autograd.grad(loss.sum(), parts)
            for (a, b), g in zip(self.model.segments, grads, strict=True):
                G[sl, a:b] = g
            L[sl] = loss.detach()
        return G, L

    @torch.no_grad()
    def losses(self, clients, Z, round, stream, salt=0):
        m = clients.numel()
        salts, streams = rng.per_row(salt, m), rng.per_row(stream, m)
        out = torch.empty(m, device=self.device, dtype=Z.dtype)
        for sl in self._chunks(m):
            xb, yb = self.batches.batch(clients[sl], round, streams[sl], salts[sl])
            with self.autocast():
                out[sl] = self._loss(Z[sl], xb, yb)
        return out

    @torch.no_grad()
    def evaluate(self, clients: torch.Tensor, Z: torch.Tensor) -> Evaluation:
        """Test loss/accuracy of Z[k] on client k's test set."""
        ones = torch.ones(clients.numel(), 1, device=self.device, dtype=Z.dtype)
        return self.evaluate_mixture(clients, Z[:, None], ones)

    @torch.no_grad()
    def evaluate_mixture(
        self, clients: torch.Tensor, Z: torch.Tensor, weights: torch.Tensor
    ) -> Evaluation:
        """Test metrics of client k predicting with the mixture sum_j weights[k, j]
        softmax(h_{Z[k, j]}(x)). Z: (m, k, d), weights: (m, k) rows summing to 1. Batched
        over clients with padded test blocks; log-probabilities combined by logsumexp."""
        m, k = Z.shape[0], Z.shape[1]
        loss_sum = torch.zeros(m, device=self.device, dtype=torch.float64)
        correct = torch.zeros(m, device=self.device, dtype=torch.float64)
        count = torch.zeros(m, device=self.device, dtype=torch.float64)
        cl = clients.tolist()
        lengths = torch.tensor([self.test_idx[c].numel() for c in cl])
        T = int(lengths.max()) if m else 0
        logw = torch.log(weights.to(Z.dtype).clamp_min(1e-30))  # (m, k)
        per_chunk = max(1, self.eval_rows // k)
        for a in range(0, m, per_chunk):
            ids = list(range(a, min(m, a + per_chunk)))
            idx = torch.zeros(len(ids), T, dtype=torch.int64, device=self.device)
            lab = torch.zeros(len(ids), T, dtype=torch.int64, device=self.device)
            mask = torch.zeros(len(ids), T, dtype=torch.bool, device=self.device)
            for r, c in enumerate(ids):
                n_c = int(lengths[c])
                idx[r, :n_c] = self.test_idx[cl[c]]
                lab[r, :n_c] = self.test_y[cl[c]]
                mask[r, :n_c] = True
            r = len(ids)
            P = Z[a : a + r].reshape(r * k, -1)  # (r*k, d), client-major
            for b in range(0, T, self.eval_block):
                sl = slice(b, min(T, b + self.eval_block))
                x = self.test_x[idx[:, sl]]  # (r, blk, ...)
                xk = x.unsqueeze(1).expand(r, k, *x.shape[1:]).reshape(r * k, *x.shape[1:])
                with self.autocast():
                    logits = self.model.forward(P, xk)
                logp = torch.log_softmax(logits.float(), dim=-1)  # (r*k, blk, C)
                blk, C = logp.shape[1], logp.shape[2]
                logp = logp.view(r, k, blk, C) + logw[a : a + r, :, None, None]
                mix = torch.logsumexp(logp, dim=1)  # (r, blk, C) log of the mixture
                y = lab[:, sl]
                nll = -mix.gather(-1, y[..., None]).squeeze(-1)  # (r, blk)
                mk = mask[:, sl]
                loss_sum[a : a + r] += (nll * mk).sum(1).double()
                correct[a : a + r] += ((mix.argmax(-1) == y) & mk).sum(1).double()
                count[a : a + r] += mk.sum(1).double()
        return Evaluation(loss=(loss_sum / count).float(), accuracy=(correct / count).float())


class LoopOps(_SupervisedBase):
    """Reference ClientOps: a plain per-client PyTorch loop over nn.Module copies."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.channels_last = self.execution.channels_last
        if self.channels_last:  # NHWC weights; loading copies into them (layout kept)
            self.model.module.to(device=self.device, memory_format=torch.channels_last)

    def _load(self, flat: torch.Tensor) -> torch.nn.Module:
        module = self.model.module
        if self.channels_last:
            with torch.no_grad():
                for p, (a, b) in zip(module.parameters(), self.model.segments, strict=True):
                    p.copy_(flat[a:b].view(p.shape))
        else:
            self.model.load_into(module, flat)
        return module

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def _module_loss(self, flat: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor):
        module = self._load(flat)
        with self.autocast():
            logits = module(self._input(xb))
        return F.cross_entropy(logits.float(), yb)

    def grads(self, clients, Z, round, stream, salt=0):
        m = clients.numel()
        salts, streams = rng.per_row(salt, m), rng.per_row(stream, m)
        G = torch.empty_like(Z)
        L = torch.empty(clients.numel(), device=self.device, dtype=Z.dtype)
        module = self.model.module
        for k in range(clients.numel()):
            xb, yb = self.batches.batch(
                clients[k : k + 1], round, streams[k : k + 1], salts[k : k + 1]
            )
            module.zero_grad(set_to_none=True)
            with torch.enable_grad():
                loss = self._module_loss(Z[k], xb[0], yb[0])
                loss.backward()
            G[k] = torch.cat([p.grad.flatten() for p in module.parameters()])
            L[k] = loss.detach()
        return G, L

    @torch.no_grad()
    def losses(self, clients, Z, round, stream, salt=0):
        m = clients.numel()
        salts, streams = rng.per_row(salt, m), rng.per_row(stream, m)
        out = torch.empty(clients.numel(), device=self.device, dtype=Z.dtype)
        for k in range(clients.numel()):
            xb, yb = self.batches.batch(
                clients[k : k + 1], round, streams[k : k + 1], salts[k : k + 1]
            )
            out[k] = self._module_loss(Z[k], xb[0], yb[0])
        return out

    def _blocks(self, c: int):
        """Client c's test set in blocks of ``execution.eval_block`` samples."""
        idx, y = self.test_idx[c], self.test_y[c]
        step = self.execution.eval_block
        for a in range(0, idx.numel(), step):
            yield self.test_x[idx[a : a + step]], y[a : a + step]

    def _scored(self, clients: torch.Tensor, logprobs) -> Evaluation:
        """Test loss and accuracy of every client, block by block: ``logprobs(row, x)``
        gives the log-probabilities (blk, C) that client row ``row`` predicts for x."""
        losses, accs = [], []
        for r, c in enumerate(clients.tolist()):
            nll = correct = count = 0.0
            for x, y in self._blocks(c):
                lp = logprobs(r, x)
                nll -= float(lp.gather(1, y[:, None]).sum())
                correct += float((lp.argmax(-1) == y).sum())
                count += y.numel()
            losses.append(nll / count)
            accs.append(correct / count)
        dev = self.device
        return Evaluation(torch.tensor(losses, device=dev), torch.tensor(accs, device=dev))

    @torch.no_grad()
    def evaluate_mixture(
        self, clients: torch.Tensor, Z: torch.Tensor, weights: torch.Tensor
    ) -> Evaluation:
        def mixture(r: int, x: torch.Tensor) -> torch.Tensor:
            probs = 0
            for j in range(Z.shape[1]):
                module = self._load(Z[r, j])
                with self.autocast():
                    logits = module(self._input(x))
                probs = probs + weights[r, j] * torch.softmax(logits.float(), dim=-1)
            return torch.log(probs.clamp_min(1e-30))

        return self._scored(clients, mixture)

    @torch.no_grad()
    def evaluate(self, clients: torch.Tensor, Z: torch.Tensor) -> Evaluation:
        def own(r: int, x: torch.Tensor) -> torch.Tensor:
            module = self._load(Z[r])  # once per block: cheap next to the forward
            with self.autocast():
                logits = module(self._input(x))
            return torch.log_softmax(logits.float(), dim=-1)

        return self._scored(clients, own)
