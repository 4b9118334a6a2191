"""meta-L2C: L2C's round with mixing weights from a learned encoder of the clients' model
changes (Li et al., CVPR 2022, Algorithm 1 line 14, Eq. 4-8; see ``l2c.py``).

w_ij = softmax_j <E(Delta hat theta_i), E(Delta hat theta_j)> with Delta hat theta_i =
theta_i^{t+1/2} - theta_i^0. The encoder is shared by all clients (line 24's AllReduce):
its objective is the mean validation loss (Eq. 6). E_l is one two-layer network per layer
applied to every channel (output unit / filter) of that layer (Eq. 7); a vector parameter
(a bias) is one channel. A trained encoder is exported (``encoder.pt``) and can be loaded
into another run (``algorithm.encoder_path``, transfer); clients also receive the Delta
hat theta_j, so a round sends twice L2C's bytes.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn

from raycobo import rng
from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.l2c import L2C, L2CConfig
from raycobo.settings import ConfigError


class MetaL2CConfig(L2CConfig):
    """meta-L2C: L2C's settings and the encoder's (paper: output sizes (10, 5))."""

    name: Literal["meta_l2c"] = "meta_l2c"
    encoder_hidden: int = Field(default=10, ge=1, description="hidden units of E_l")
    encoder_out: int = Field(default=5, ge=1, description="outputs of E_l per channel")
    encoder_path: str | None = Field(default=None, description="pre-trained encoder to load")
    train_encoder: bool = Field(default=True, description="false: keep a loaded encoder fixed")


class ChannelEncoder(nn.Module):
    """meta-L2C's E: per layer l a two-layer network E_l applied to every channel of the
    layer, outputs concatenated (Eq. 7-8). ``layout``: (offset, channels, size) blocks."""

    def __init__(self, layout: list[tuple[int, int, int]], hidden: int = 10, out: int = 5):
        super().__init__()
        self.layout = [tuple(int(v) for v in b) for b in layout]
        self.sizes = [size for _, _, size in self.layout]
        self.nets = nn.ModuleList(
            nn.Sequential(nn.Linear(size, hidden), nn.ReLU(), nn.Linear(hidden, out))
            for size in self.sizes
        )

    def forward(self, V: torch.Tensor) -> torch.Tensor:
        """V: (m, d) flat parameter vectors -> (m, sum_l channels_l * out)."""
        m = V.shape[0]
        parts = []
        for (offset, channels, size), net in zip(self.layout, self.nets, strict=True):
            block = V[:, offset : offset + channels * size].reshape(m, channels, size)
            parts.append(net(block).reshape(m, -1))
        return torch.cat(parts, dim=1)


class EncoderMixing:
    """meta-L2C's mixing parameters: the shared ChannelEncoder."""

    transfers_per_edge = 2  # Delta theta_j and Delta hat theta_j

    def __init__(self, cfg: MetaL2CConfig, seed: int):
        self.cfg, self.seed = cfg, seed

    def make_params(self, ops: ClientOps, n: int) -> ChannelEncoder:
        c = self.cfg
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(rng.hash_ints(self.seed, rng.INIT, 0xE2C)))
            enc = ChannelEncoder(ops.param_layout(), c.encoder_hidden, c.encoder_out)
        if c.encoder_path is not None:
            load_encoder(enc, c.encoder_path)
        return enc.to(ops.device)

    def trainable(self, params: ChannelEncoder) -> list[torch.Tensor]:
        return list(params.parameters()) if self.cfg.train_encoder else []

    def logits(self, params: ChannelEncoder, Dhat: torch.Tensor) -> torch.Tensor:
        E = params(Dhat)  # (n, e)
        return E @ E.T  # f(theta_i, theta_j) = <E_i, E_j> (Eq. 5)

    def objective_scale(self, n: int) -> float:
        return float(n)  # the encoder minimises the mean validation loss (Eq. 6)

    def artifacts(self, params: ChannelEncoder) -> dict[str, Any]:
        """The trained encoder, loadable with ``algorithm.encoder_path`` (transfer)."""
        return {"encoder": encoder_payload(params)}


def meta_l2c(cfg: MetaL2CConfig, rounds: int, seed: int) -> L2C:
    """meta-L2C: the L2C round with the encoder's mixing weights."""
    return L2C(cfg, rounds, seed, mixing=EncoderMixing(cfg, seed), name="meta_l2c")


def encoder_payload(enc: ChannelEncoder) -> dict[str, Any]:
    return {
        "sizes": list(enc.sizes),
        "state_dict": {k: v.detach().cpu() for k, v in enc.state_dict().items()},
    }


def load_encoder(enc: ChannelEncoder, path: str) -> None:
    """Load a pre-trained encoder; its per-layer channel sizes must match this model's
    (the channel counts may differ: E_l is shared across a layer's channels)."""
    from pathlib import Path

    if not Path(path).is_file():
        raise ConfigError(f"invalid config key 'algorithm.encoder_path': no file {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - damaged, foreign or pickled code: one line
        raise ConfigError(
            f"invalid config key 'algorithm.encoder_path': {path} cannot be read as a meta-L2C "
            f"encoder (plain tensors only): {type(err).__name__}"
        ) from None
    if not isinstance(payload, dict) or not {"state_dict", "sizes"} <= set(payload):
        raise ConfigError(
            f"invalid config key 'algorithm.encoder_path': {path} is not a meta-L2C encoder "
            "(an encoder.pt written by a meta_l2c run)"
        )
    if list(payload["sizes"]) != list(enc.sizes):
        raise ConfigError(
            f"invalid config key 'algorithm.encoder_path': {path} encodes layers of channel "
            f"sizes {list(payload['sizes'])}, this model has {enc.sizes}"
        )
    try:
        enc.load_state_dict(payload["state_dict"])
    except RuntimeError as err:
        first = str(err).splitlines()[0]
        raise ConfigError(f"invalid config key 'algorithm.encoder_path': {first}") from None
