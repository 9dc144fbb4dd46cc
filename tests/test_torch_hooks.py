"""register_hook (and its first name, register) on a one-rank DDP model: it builds the
state on DDP's process group, registers the fp32 or fp16 hook, and the state closes as
a context manager. The hooks' contract and the two-rank runs are in
test_torch_optimizer.py and test_torch_distributed.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


class Sum:
    """A one-rank allreduce without ``start``: the hook state runs it on its thread."""

    nranks = 1

    def __init__(self) -> None:
        self.dtypes: list[torch.dtype] = []

    def __call__(self, buffer: torch.Tensor) -> torch.Tensor:
        self.dtypes.append(buffer.dtype)
        return buffer


@pytest.mark.parametrize("fp16", [False, True])
def test_register_hook_puts_the_hook_on_ddp(tmp_path, fp16):
    import torch.distributed as dist

    from topoplan.torch import TopoplanHookState, register, register_hook

    assert register is register_hook
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        plain = torch.nn.Linear(4, 2)
        plain.load_state_dict(model.state_dict())
        x = torch.randn(3, 4)
        wire = Sum()
        with register_hook(ddp, allreduce=wire, fp16=fp16) as state:
            assert isinstance(state, TopoplanHookState)
            assert state.process_group is ddp.process_group
            ddp(x).sum().backward()
        assert not state._progress.thread.is_alive()
        assert wire.dtypes and set(wire.dtypes) == {torch.float16 if fp16 else torch.float32}
        plain(x).sum().backward()
        for ours, local in zip(model.parameters(), plain.parameters()):
            assert torch.allclose(ours.grad, local.grad, rtol=1e-3 if fp16 else 1e-6)
    finally:
        dist.destroy_process_group()


class Broken:
    """A one-rank allreduce that fails as a planned step does."""

    nranks = 1
    MESSAGE = "rank 0: mpi ring allreduce, step 1: recv of chunk 0 from peer 2 failed: rank 2 died"

    def __call__(self, buffer: torch.Tensor) -> torch.Tensor:
        from topoplan.errors import TransportError
        raise TransportError(self.MESSAGE, rank=0, step=1, peer=2)


def test_a_failed_call_reaches_ddp_as_its_message(tmp_path):
    """DDP's reducer reads a hook's Future in C++: an exception set from Python reached
    the user as "Unable to cast <message> to Tensor"; it must arrive as the error."""
    import torch.distributed as dist

    from topoplan.torch import register_hook

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        with register_hook(ddp, allreduce=Broken()):
            with pytest.raises(RuntimeError) as caught:
                ddp(torch.randn(3, 4)).sum().backward()
        assert Broken.MESSAGE in str(caught.value), str(caught.value)
        assert "Unable to cast" not in str(caught.value)
    finally:
        dist.destroy_process_group()
