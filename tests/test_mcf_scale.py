"""mcf's grids at scale: the box whole, radix 4 across the boxes (fewer messages a
pipeline piece, so more pieces fit the op budget on rail and fat-tree fabrics)."""

from __future__ import annotations

import warnings

from topoplan.cluster import loads_cluster
from topoplan.cluster.generate import rail_optimized
from topoplan.planners.mcf import plan_mcf
from topoplan.planners.mcf.grids import _radix_factors, layouts
from topoplan.planners.mcf.messages import message_count

MIXED = "(direct, radix 4 across boxes)"


def test_radix_factors_merge_a_short_tail_only_when_asked():
    assert _radix_factors(128, 4) == [4, 4, 4, 2]  # the radix-4 grids as before
    assert _radix_factors(128, 4, merge_tail=True) == [4, 4, 8]
    assert _radix_factors(1024, 4, merge_tail=True) == [4, 4, 4, 4, 4]
    assert _radix_factors(32, 4, merge_tail=True) == [4, 8]
    assert _radix_factors(1024, 16, merge_tail=True) == [16, 16, 4]  # 64 > 2 x 16
    assert _radix_factors(7, 4, merge_tail=True) == [7]


def test_rail_grids_keep_the_box_whole_with_radix_4_across_boxes():
    cluster = loads_cluster(rail_optimized(32))  # 256 GPUs, boxes of 8 on an NVSwitch
    grids = {g.name: g for g in layouts(cluster)}
    mixed = grids[f"box[8]x1 > boxes[32] {MIXED}"]
    assert mixed.dims == (8, 8, 4) and all(mixed.direct)
    old = grids["box[8]x1 > boxes[32] (direct radix 4)"]  # the box cut in two levels
    assert old.dims[:2] == (2, 4)
    # one in-box step and 7 + 7 + 3 peers a rank: fewer messages than radix 16 (7 + 31)
    direct = grids["box[8]x1 > boxes[32] (direct)"]
    assert message_count(mixed) < message_count(direct)


def test_mcf_picks_it_on_256_rail_gpus_under_ideal():
    cluster = loads_cluster(rail_optimized(32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        schedule = plan_mcf(cluster, size=256 << 20, profile="ideal")  # verified
    meta = schedule.meta
    assert MIXED in meta["construction"]
    # more pieces in the same op budget: a shorter fill than every other grid
    others = [v for k, v in meta["candidates"].items() if MIXED not in k]
    assert meta["estimate_s"] < min(others) * 0.999
