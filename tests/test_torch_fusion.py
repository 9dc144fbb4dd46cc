"""Tensor fusion (topoplan/torch/fusion.py): the layout fuse() makes, and a group's
gradients packed into a flat buffer (pre-scaled, zeros for a missing gradient) and
written back."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from topoplan.torch.fusion import fuse  # noqa: E402


def named(*shapes, dtype=torch.float32):
    return [(f"p{i}", torch.nn.Parameter(torch.zeros(shape, dtype=dtype)))
            for i, shape in enumerate(shapes)]


def test_fuse_packs_in_order_up_to_the_threshold_one_dtype_a_group():
    params = named(128, 16, 64, 4)  # 512, 64, 256, 16 bytes
    layout = lambda t: [g.names for g in fuse(params, t)]  # noqa: E731
    assert layout(64 << 20) == [["p0", "p1", "p2", "p3"]]
    assert layout(0) == [["p0"], ["p1"], ["p2"], ["p3"]]
    assert layout(400) == [["p0"], ["p1", "p2", "p3"]]  # too big for a buffer: alone
    assert layout(576) == [["p0", "p1"], ["p2", "p3"]]
    mixed = named(2, 3) + [("d", torch.nn.Parameter(torch.zeros(2, dtype=torch.float64)))]
    mixed += [("e", torch.nn.Parameter(torch.zeros(1)))]
    groups = fuse(mixed, 64 << 20)
    assert [(g.dtype, g.names, g.numels, g.numel) for g in groups] == [
        (torch.float32, ["p0", "p1", "e"], [2, 3, 1], 6), (torch.float64, ["d"], [2], 2)]


def test_pack_scales_and_zero_fills_unpack_writes_back():
    (group,) = fuse(named((2, 2), 3, 1), 64 << 20)
    a, b, c = group.params
    a.grad = torch.tensor([[4.0, 8.0], [-4.0, 2.0]])
    c.grad = torch.tensor([6.0])
    flat = group.empty()
    assert flat.shape == (8,) and flat.dtype == torch.float32
    flat.fill_(float("nan"))  # b has no gradient: zeros, not what the buffer held
    assert group.pack(flat, 2) is flat
    assert flat.tolist() == [2.0, 4.0, -2.0, 1.0, 0.0, 0.0, 0.0, 3.0]
    flat.mul_(10)
    group.unpack(flat)
    assert a.grad.tolist() == [[20.0, 40.0], [-20.0, 10.0]] and c.grad.tolist() == [30.0]
    assert b.grad.tolist() == [0.0, 0.0, 0.0]  # a missing gradient gets a copy ...
    flat.fill_(7.0)
    assert b.grad.tolist() == [0.0, 0.0, 0.0]  # ... not a view of the buffer


@pytest.mark.parametrize("threshold", [0, 1 << 20, 25 << 20, 64 << 20])
def test_the_estimator_buckets_a_model_as_the_optimizer_fuses_its_parameters(threshold):
    """One rule (topoplan.runtime.fusion.fusion_buckets): the estimator's buckets of a
    network are the optimizer's groups of parameters of its tensors' sizes, in backward
    order."""
    from topoplan.estimate import fuse as buckets, get_model

    model = get_model("resnet50")
    backward = [(str(i), torch.nn.Parameter(torch.empty(t.numel)))
                for i, t in reversed(list(enumerate(model.tensors)))]
    groups = fuse(backward, threshold)
    assert buckets(model, threshold, 4) == [
        (4 * g.numel, len(g.names), min(int(name) for name in g.names)) for g in groups]
