"""The settings that several methods share, as small mixins of the per-method config
classes (each method's own class lives in its module, e.g. ``CoBoConfig`` in
``cobo/settings.py``). A method's section holds exactly the keys the method reads: a key of
another method is refused when the config is loaded (``raycobo.config``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from raycobo.settings import Section


class MethodConfig(Section):
    """Every method: its name and the model step size. ``uses_validation``: the method
    learns from each client's held-out validation loss, so ``data.validation_fraction``
    defaults to 0.2 for it (L2C Section 4)."""

    uses_validation: ClassVar[bool] = False
    # keys of earlier versions -> what became of them (said where a config names one)
    retired: ClassVar[dict[str, str]] = {}

    name: str
    lr: float = Field(default=0.1, gt=0, description="eta: model step size")

    def effective(self) -> dict:
        """The settings as the method runs them (keys left null for a method's own rule
        filled in), for records that are searched by value (MLflow params)."""
        return self.model_dump(mode="json")

    def collaboration_cut(self) -> float | None:
        """The least w_ij the method's update reads (CoBo's pull threshold): W's entries
        below it are learned but left out of the models' step. None: the whole W is read
        (or the method has none)."""
        return None

    def pinned(self) -> MethodConfig:
        """These settings with every value the method would choose written out: what a
        run records, so that a later change of a default cannot change it on resume."""
        return type(self).model_validate(self.effective())


class LocalTraining(Section):
    local_steps: int = Field(default=1, ge=1, description="local SGD steps per round")


class EpochLocalTraining(Section):
    """LocalTraining for a method that learns from how far the clients' models move apart
    in a round (FedALA, pFedGraph): after a single step they hardly do."""

    local_steps: int = Field(
        default=5,
        ge=1,
        description="local SGD steps per round (5: about one epoch of the quickstart's "
        "clients; the method reads how far a round moves the models apart)",
    )


class ClientSampling(Section):
    client_rate: float = Field(
        default=1.0, gt=0, le=1, description="share of clients taking part in a round"
    )


class ServerStep(Section):
    server_lr: float = Field(default=1.0, gt=0, description="eta_g: server step size")


class TopKShare(Section):
    topk_fraction: float = Field(default=0.01, gt=0, le=1, description="K / d")


class ClusterCount(Section):
    num_clusters: int | None = Field(
        default=None, ge=1, description="clusters; null: the ground-truth number"
    )


class Decoding(Section):
    decode_steps: int = Field(default=20, ge=1, description="I_dec, FISTA iterations")
