"""Every built-in method counts what a round sends (``bytes_sent``: both directions,
float32 numbers, an index 4 bytes more), checked here against a count by hand on the
4-client digits task (2 clusters of 2; an MLP 64-16-10, d = 1,210 parameters)."""

from __future__ import annotations

import pytest
import torch

from raycobo.algorithms.common import sample_clients
from raycobo.config import load_config
from tests.helpers import DIGITS, build

N, D = 4, 64 * 16 + 16 + 16 * 10 + 10  # clients, MLP parameters


def sent_per_round(*overrides: str, rounds: int = 3) -> tuple[list[float], object, object]:
    """bytes_sent of each of the first ``rounds`` rounds -> (bytes, algo, last state)."""
    cfg = load_config(None, [*DIGITS, *overrides])
    _, ops, algo = build(cfg)
    assert ops.dim == D
    state, sent = algo.init(ops), []
    for t in range(rounds):
        state, stats = algo.round(state, t, ops)
        sent.append(stats["bytes_sent"])
    return sent, algo, state


def test_local_sends_nothing():
    assert sent_per_round("algorithm.name=local")[0] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("name", ["fedavg", "ditto", "oracle"])
def test_a_server_model_down_and_each_update_back(name):
    """FedAvg, Ditto (its personal models stay home) and the Oracle (the client's
    cluster model): 2 models per sampled client; at client_rate 0.5, the sampled ones."""
    assert sent_per_round(f"algorithm.name={name}")[0] == [2 * N * D * 4] * 3
    half, algo, _ = sent_per_round(f"algorithm.name={name}", "algorithm.client_rate=0.5")
    m = [sample_clients(N, 0.5, algo.seed, t).numel() for t in range(3)]
    assert half == [2 * k * D * 4 for k in m]


def test_ifca_sends_every_cluster_model_down():
    """k = 2 cluster models to each client, its update and its cluster's index back."""
    assert sent_per_round("algorithm.name=ifca")[0] == [N * (3 * D * 4 + 4)] * 3


def test_fc_sends_every_model_to_every_client_and_the_gradients_back():
    assert sent_per_round("algorithm.name=fc")[0] == [2 * N * (N - 1) * D * 4] * 3


def test_federico_exchanges_with_its_sampled_neighbours():
    """M = 2 neighbours each (of 3 others): their models down, the weighted gradients back."""
    sent = sent_per_round("algorithm.name=federico", "algorithm.neighbors=2")[0]
    assert sent == [2 * N * 2 * D * 4] * 3


def test_validation_based_counts_the_trusted_gradients_and_the_validated_models():
    """Trust is the identity until round trust_every = 2 (nothing sent), then every model
    goes to every other client once and each client gets its 3 peers' gradients (softmax
    trust is never 0) every round."""
    sent = sent_per_round("algorithm.name=validation_based", "algorithm.trust_every=2")[0]
    assert sent == [0.0, 0.0, (N * (N - 1) + N * (N - 1)) * D * 4]


@pytest.mark.parametrize("weights", ["dense", "sparse"])
def test_cobo_counts_its_pairs_and_the_collaborators_its_pull_reads(weights):
    """Every pair scored (sampling full: 6 a round) sends the two models for the
    midpoint, one end's gradient there and the score back (3d + 1 numbers); the pull
    sends one model per collaborator read. Algorithm 1 as printed (rule paper: W^0 = 1,
    no threshold) reads all 12 ordered pairs in the first round while W is still 1."""
    over = ["algorithm.name=cobo", "algorithm.sampling=full", f"algorithm.weights={weights}"]
    paper, _, _ = sent_per_round(*over, "algorithm.preset=paper", rounds=1)
    assert paper == [4 * (6 * (3 * D + 1) + 12 * D)]
    sent, algo, state = sent_per_round(*over, "algorithm.pull_threshold=0.5", rounds=2)
    W = algo.collaboration(state)  # the W the last round's pull read (the step keeps W)
    off = ~torch.eye(N, dtype=torch.bool)
    reads = int(((W >= 0.5) & (W != 0) & off).sum())
    assert sent[-1] == 4 * (6 * (3 * D + 1) + reads * D)


def test_fedavg_ft_sends_fedavgs_rounds_and_nothing_while_it_fine_tunes():
    sent = sent_per_round("algorithm.name=fedavg_ft", "algorithm.ft_steps=2", "rounds=4", rounds=4)
    assert sent[0] == [2 * N * D * 4] * 2 + [0.0, 0.0]


@pytest.mark.parametrize(("name", "transfers"), [("l2c", 1), ("meta_l2c", 2)])
def test_l2c_sends_each_neighbours_update_and_meta_l2c_its_change_too(name, transfers):
    """Every client reads its n - 1 neighbours' Delta theta (meta-L2C: and their Delta
    hat theta for the encoder) before any pruning: 12 directed links."""
    sent = sent_per_round(f"algorithm.name={name}", rounds=1)[0]
    assert sent == [N * (N - 1) * D * 4 * transfers]


def test_topk_ef_sends_k_pairs_up_and_the_aggregate_down():
    """Up: k (value, index) pairs a client; down: the aggregate's nonzero coordinates as
    pairs, or the dense model where that is smaller (read off the model's change)."""
    cfg = load_config(None, [*DIGITS, "algorithm.name=topk_ef", "algorithm.topk_fraction=0.05"])
    _, ops, algo = build(cfg)
    k = round(0.05 * D)
    state = algo.init(ops)
    x0 = state.x.clone()
    state, stats = algo.round(state, 0, ops)
    down = int((state.x != x0).sum())
    assert 0 < down <= N * k
    assert stats["bytes_sent"] == N * k * 8 + N * min(4 * D, 8 * down)


def test_countsketch_sends_each_sketch_up_and_k_pairs_down():
    sent = sent_per_round("algorithm.name=countsketch", "algorithm.sketch_cols=200", rounds=1)
    k = round(0.01 * D)
    assert sent[0] == [N * (5 * 200 * 4 + min(4 * D, 8 * k))]
