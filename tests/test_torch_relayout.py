"""Relayout (topoplan/torch/relayout.py) on one process: the new order, when the layout
is kept, and the one fingerprint allreduce that keeps the ranks in agreement. The real
two-rank runs are in test_torch_optimizer.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from topoplan.torch.fusion import fuse  # noqa: E402
from topoplan.torch.relayout import backward_order  # noqa: E402


class Ranks:
    """An allreduce over ``nranks`` ranks; ``other`` is what the other ranks add (by
    default each the same as this rank)."""

    def __init__(self, nranks: int, other=None) -> None:
        self.nranks, self.other, self.calls = nranks, other, 0

    def __call__(self, buffer: torch.Tensor) -> None:
        self.calls += 1
        if self.other is None:
            buffer.mul_(self.nranks)
        else:
            buffer.add_(self.other)


def layout(*names: str):
    return fuse([(n, torch.nn.Parameter(torch.zeros(1))) for n in names], 0)


def test_buffers_follow_the_order_backward_made_unused_ones_last():
    groups = layout("a", "b", "c", "d")
    world = Ranks(3)
    order = backward_order(groups, ["c", "a", "c", "b"], world, 3)
    assert [name for name, _ in order] == ["c", "a", "b", "d"]
    assert [p for _, p in order] == [groups[2].params[0], groups[0].params[0],
                                     groups[1].params[0], groups[3].params[0]]
    assert world.calls == 1


def test_a_layout_that_starts_every_buffer_when_full_is_kept():
    world = Ranks(2)
    assert backward_order(layout("a", "b", "c"), ["a", "b", "c"], world, 2) is None
    # a buffer of two: full when b arrives, after c's buffer; here a and b come first
    groups = fuse([(n, torch.nn.Parameter(torch.zeros(1))) for n in "abc"], 8)
    assert [g.names for g in groups] == [["a", "b"], ["c"]]
    assert backward_order(groups, ["b", "a", "c"], world, 2) is None
    assert [n for n, _ in backward_order(groups, ["a", "c", "b"], world, 2)] == ["a", "c", "b"]
    assert world.calls == 3


def test_one_buffer_needs_no_order_and_no_call():
    world = Ranks(2)
    groups = fuse([(n, torch.nn.Parameter(torch.zeros(1))) for n in "ab"], 1 << 20)
    assert backward_order(groups, ["b", "a"], world, 2) is None and world.calls == 0


def test_ranks_that_saw_another_order_keep_the_layout():
    groups = layout("a", "b", "c")
    # this rank saw b, a, c (positions 1, 0, 2 at places 1, 2, 3): sums 7 and 13; the
    # other rank a, c, b (positions 0, 2, 1): 7 and 11, the first sum alike
    other = torch.tensor([1 * 0 + 2 * 2 + 3 * 1, 1 * 0 + 2 * 4 + 3 * 1], dtype=torch.float64)
    assert backward_order(groups, ["b", "a", "c"], Ranks(2, other), 2) is None
    # the other rank saw b, a, c too
    same = torch.tensor([1 * 1 + 2 * 0 + 3 * 2, 1 * 1 + 2 * 0 + 3 * 4], dtype=torch.float64)
    assert [n for n, _ in backward_order(groups, ["b", "a", "c"], Ranks(2, same), 2)] == [
        "b", "a", "c"]
