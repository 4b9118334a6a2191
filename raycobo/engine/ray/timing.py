"""The coordinator's measure of the rounds, shared by every round policy."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RoundTiming:
    """The coordinator's measure of the rounds (reported in ``engine_report``)."""

    compute_s: float = 0.0  # wall time of rounds inside the coordinator
    host_compute_s: float = 0.0  # of which the slowest host computed
    # from the first round's start to the last round's end, less the calls between
    # rounds (evaluations, outputs, membership): pipelined rounds overlap the gaps
    span: list[float] = field(default_factory=list)
    between_s: float = 0.0
    ahead_wait_s: float = 0.0  # calls between rounds waiting for a round submitted ahead
