"""State trees: any method's state as plain data and back into a fresh template."""

from __future__ import annotations

import io
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from raycobo.state import CheckpointError, load_into, state_tree


@dataclass
class Inner:
    w: torch.Tensor
    note: str | None = None


@dataclass
class Outer:
    X: torch.Tensor
    inner: Inner
    parts: list
    table: dict
    net: nn.Module
    opt: torch.optim.Optimizer
    later: torch.Tensor | None = None


def _state(seed: int) -> Outer:
    g = torch.Generator().manual_seed(seed)
    net = nn.Linear(3, 2)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    return Outer(
        torch.randn(4, 3, generator=g),
        Inner(torch.randn(2, generator=g), "x"),
        [torch.arange(3), 1.5, None],
        {"a": torch.ones(2), "n": 3},
        net,
        opt,
    )


def test_a_tree_holds_plain_data_that_weights_only_loading_reads():
    s = _state(0)
    s.net(torch.randn(5, 3)).sum().backward()
    s.opt.step()  # Adam has per-parameter state now
    tree = state_tree(s)
    buf = io.BytesIO()
    torch.save(tree, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    assert back["__dataclass__"] == "Outer"
    assert torch.equal(back["fields"]["X"], s.X)
    assert back["fields"]["parts"][1:] == [1.5, None]


def test_load_into_restores_every_value_and_keeps_the_optimizer_on_the_parameters():
    a = _state(0)
    a.net(torch.randn(5, 3)).sum().backward()
    a.opt.step()
    a.later = torch.full((2,), 7.0)
    b = _state(1)  # a fresh template of the same kind
    b_params = list(b.net.parameters())
    out = load_into(b, state_tree(a))
    assert out is b
    assert torch.equal(b.X, a.X) and torch.equal(b.inner.w, a.inner.w) and b.inner.note == "x"
    assert torch.equal(b.parts[0], a.parts[0]) and b.table["n"] == 3
    assert torch.equal(b.later, a.later)  # None in the template, set in the saved state
    for p, q in zip(b.net.parameters(), a.net.parameters(), strict=True):
        assert torch.equal(p, q)
    # the optimizer still points at the template's parameter objects, with the saved state
    assert [id(p) for p in b.opt.param_groups[0]["params"]] == [id(p) for p in b_params]
    step = b.opt.state[b_params[0]]["step"]
    assert float(step) == 1.0


def test_a_mismatched_tree_is_refused_with_a_path():
    tree = state_tree(_state(0))
    with pytest.raises(
        CheckpointError, match="state: the checkpoint holds a Outer, the run a Inner"
    ):
        load_into(Inner(torch.zeros(2)), tree)
    tree["fields"]["X"] = [1, 2]
    with pytest.raises(CheckpointError, match=r"state\.X: expected a tensor"):
        load_into(_state(1), tree)


def test_fields_added_since_a_file_was_written():
    """A dataclass field that a newer version added (CoBo's momentum buffer M) restores
    from an older tree when the template leaves it unset; a missing set field is named."""
    old = state_tree(Inner(torch.ones(2)))
    del old["fields"]["note"]
    restored = load_into(Inner(torch.zeros(2)), old)
    assert restored.note is None and torch.equal(restored.w, torch.ones(2))
    with pytest.raises(CheckpointError, match="has no note"):
        load_into(Inner(torch.zeros(2), "set"), old)


def test_what_cannot_be_saved_is_named():
    with pytest.raises(CheckpointError, match="cannot checkpoint a generator"):
        state_tree({"g": (x for x in range(2))})
