"""Overlap (topoplan/torch/overlap.py) on one process with a fake ``start``: buffers
start from the gradient hooks in index order (one that fills early waits for those
before it), finish restores them in start order, and a second backward in a step is
refused. The real two-rank runs are in test_torch_optimizer.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from topoplan import TopoplanError  # noqa: E402
from topoplan.torch import Compression  # noqa: E402
from topoplan.torch.buffers import BufferPool  # noqa: E402
from topoplan.torch.fusion import fuse  # noqa: E402
from topoplan.torch.overlap import Overlap  # noqa: E402
from topoplan.torch.timing import CommTime  # noqa: E402


class Handle:
    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer, self.done = buffer, False

    def test(self) -> bool:
        return self.done

    def wait(self) -> torch.Tensor:
        self.buffer.mul_(2)  # two equal ranks
        self.done = True
        return self.buffer


class TwoRanks:
    nranks = 2

    def __init__(self) -> None:
        self.started: list[int] = []

    def start(self, buffer: torch.Tensor) -> Handle:
        self.started.append(buffer.numel())
        return Handle(buffer)


def test_buffers_start_in_index_order_and_finish_restores_them():
    a = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    b = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
    pool = BufferPool(fuse([("b", b), ("a", a)], 0), 1)  # buffer 0 holds b, buffer 1 a
    world, clock = TwoRanks(), CommTime()
    overlap = Overlap(world, Compression.none, 2, clock, poll_interval=0)
    overlap.layout(pool)
    seen: dict[str, list[int]] = {}

    def record(name: str):
        def hook(_param: torch.Tensor) -> None:
            seen.setdefault(name, list(world.started))
        return hook

    for name, p in (("a", a), ("b", b)):  # they run after the overlap's own hooks
        p.register_post_accumulate_grad_hook(record(name))
    ((a * (b * 3).sum()).sum()).backward()  # a's gradient comes first
    assert overlap.made == ["a", "b"]
    assert seen == {"a": [], "b": [3, 2]}  # a's buffer was full first but waited for b's
    assert overlap.finish(0) is True and overlap.finish(0) is False
    # the mean of two equal ranks: the local gradients, 3 * sum(a) and 3 * sum(b)
    assert pool.flat(0, 0).tolist() == [9.0] * 3 and pool.flat(1, 0).tolist() == [18.0] * 2
    assert clock.wait_seconds > 0 and clock.comm_seconds >= 0
    with pytest.raises(TopoplanError, match="'a' changed after its buffer's allreduce started"):
        ((a * (b * 3).sum()).sum()).backward()
    overlap.next_step(0)
    b.grad = a.grad = None
    ((a * (b * 3).sum()).sum()).backward()  # a new step: both start again
    assert world.started == [3, 2, 3, 2]
    overlap.close()
    assert overlap.hooks == [] and overlap.progress.closed
    assert overlap.finish(0) is False  # close finished the calls
