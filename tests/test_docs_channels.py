"""docs/SCHEDULE.md's version 4 example (channels) loads, verifies and means what the
text says of it."""

from __future__ import annotations

from topoplan.ir.parse import loads_schedule
from topoplan.ir.verify import verify

from .test_docs import blocks


def test_the_channels_example_loads_and_verifies():
    text = blocks("SCHEDULE.md", "json")[3]
    schedule = loads_schedule(text, "docs/SCHEDULE.md (version 4)")
    assert schedule.version == 4 and schedule.nchannels == 2
    assert verify(schedule).nranks == 2
    # channel 0: chunks 0 and 1 in steps 0 and 1; channel 1: chunks 2 and 3 in step 0
    for rank in range(2):
        steps = schedule.channel_steps(rank)
        assert [s for s, _ in steps[0]] == [0, 1] and [s for s, _ in steps[1]] == [0]
    owner = {k: op.channel for _, _, op in schedule.ops() for k in range(op.chunk, op.end)}
    assert owner == {0: 0, 1: 0, 2: 1, 3: 1}
