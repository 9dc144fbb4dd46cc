"""The double-buffer pool (topoplan/torch/buffers.py): steps alternate two sets of
buffers that do not share memory, one set without double buffering."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from topoplan.torch.buffers import BufferPool  # noqa: E402
from topoplan.torch.fusion import fuse  # noqa: E402


def test_steps_alternate_two_sets_that_share_no_memory():
    params = [(f"p{i}", torch.nn.Parameter(torch.zeros(n))) for i, n in enumerate((3, 5))]
    groups = fuse(params, 0)
    for group, value in zip(groups, (1.0, 2.0)):
        group.params[0].grad = torch.full((group.numel,), value)
    pool = BufferPool(groups, 2)
    assert [pool.set_of(step) for step in range(4)] == [0, 1, 0, 1]
    first = [t.clone() for t in pool.pack(0, 1)]
    assert [t.tolist() for t in first] == [[1.0] * 3, [2.0] * 5]
    for group in groups:
        group.params[0].grad.mul_(-1)
    pool.pack(1, 2)
    assert all(torch.equal(pool.flat(i, 0), first[i]) for i in range(2))  # set 0 untouched
    assert pool.flat(1, 1).tolist() == [-1.0] * 5
    pool.unpack(0)
    assert groups[1].params[0].grad.tolist() == [2.0] * 5
    single = BufferPool(groups, 1)
    assert [single.set_of(step) for step in range(3)] == [0, 0, 0]
    assert single.pack_one(0, 0, 1).data_ptr() == single.flat(0, 0).data_ptr()
