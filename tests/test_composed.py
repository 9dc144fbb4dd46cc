"""The ``composed`` planner (native steps inside the boxes, a planned exchange across them),
the ``nccl`` plan (the transport's own collective as one native step) and ``auto``
choosing among them and the point-to-point plans.

Every composed plan goes through :func:`topoplan.verify` (which checks native steps
symbolically) on every shipped topology, the target clusters
(``topologies/targets``) and small clusters of every shape; the structure is checked
by hand where it is the design (groups are boxes, one native op a step, parts sized by
the lcm of the box sizes); ``auto`` is held to "never slower than the nccl row" under
the ``nccl`` profile.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest

from tests.support.cluster_shapes import CLUSTERS, cluster
from tests.support.clusters import SHIPPED, TOPOLOGIES, load_topology
from topoplan.analysis.native.nccl import nccl_time
from topoplan.analysis.sim import simulate
from topoplan.cluster import Cluster, load_cluster, loads_cluster
from topoplan.errors import InfeasiblePlanError, PlannerError
from topoplan.ir.parse import schedule_from_dict
from topoplan.ir.schedule import Native, NativeKind, Schedule
from topoplan.ir.verify import verify
from topoplan.planners import PlanRequest, compare, nccl_candidate, plan
from topoplan.planners.composed import box_level_cluster, plan_composed, root_of
from topoplan.planners.native import plan_native

MiB = 1 << 20
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")
TARGETS = tuple(sorted(p.stem for p in (TOPOLOGIES / "targets").glob("*.yaml")))
#: Point-to-point candidates cheap enough to compare at every size in a test (mcf's
#: big plans take seconds to simulate; the bench compares them all).
CHEAP = ("hierarchical", "ring", "ring-topo", "tree", "rhd")


@functools.cache
def target(name: str) -> Cluster:
    """A target cluster (``topologies/targets/<name>.yaml``), loaded once."""
    return load_cluster(TOPOLOGIES / "targets" / f"{name}.yaml")


def checked(schedule: Schedule, where: str) -> Schedule:
    try:
        verify(schedule)
    except Exception as exc:  # noqa: BLE001 - name the case in the failure
        pytest.fail(f"composed on {where}: {exc}")
    return schedule


def natives(schedule: Schedule) -> list[tuple[int, int, Native]]:
    return [(r, s, op) for r, s, op in schedule.ops() if isinstance(op, Native)]


def check_structure(schedule: Schedule, c: Cluster, where: str) -> None:
    """What a composed plan is made of: every native op alone in its step, over the
    GPUs of one box in box order, in boxes of more than one GPU only, and every rank of a
    box running the same native ops in the same order."""
    boxes = {tuple(box.ranks) for box in c.boxes}
    by_rank: dict[int, list[Native]] = {}
    for r, s, op in natives(schedule):
        assert len(schedule.ranks[r].steps[s]) == 1, f"{where}: rank {r} step {s} shares"
        assert op.group in boxes and len(op.group) > 1, f"{where}: group {op.group}"
        assert r in op.group
        by_rank.setdefault(r, []).append(op)
    for box in c.boxes:
        lists = [by_rank.get(r, []) for r in box.ranks]
        assert all(ops == lists[0] for ops in lists), f"{where}: box {box.name}"


# --------------------------------------------------------------------------------------
# Every composed plan verifies
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("name", [n for n in SHIPPED if n != "leaf_spine_1024"])
def test_composed_verifies_on_every_shipped_topology(name: str, collective: str) -> None:
    c = load_topology(name)
    where = f"{name}, {collective} of 64 MiB"
    s = checked(plan(c, "composed", size=64 * MiB, collective=collective), where)
    check_structure(s, c, where)
    assert s.meta["algorithm"] == "composed" and s.collective == collective


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_composed_verifies_at_1024_ranks(collective: str) -> None:
    c = load_topology("leaf_spine_1024")
    s = checked(plan(c, "composed", size=256 * MiB, collective=collective), "leaf_spine_1024")
    check_structure(s, c, "leaf_spine_1024")
    # 128 boxes of 8 GPUs with a NIC each: every GPU carries its part across (variant
    # scatter), through mcf on the 128 boxes.
    assert s.meta["variant"] == "scatter"
    assert s.nnative == (2 if collective == "allreduce" else 128) * 1024


@pytest.mark.parametrize("variant", ["scatter", "root"])
@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("name", TARGETS)
def test_both_variants_verify_on_the_target_clusters(name: str, collective: str,
                                                     variant: str) -> None:
    c = target(name)
    where = f"{name}, {collective}, variant {variant}"
    unequal = len({box.gpus for box in c.boxes}) > 1
    if unequal and collective != "allreduce" and variant == "scatter":
        with pytest.raises(InfeasiblePlanError, match="variant scatter of a .* needs boxes "
                                                      "of one GPU count, got \\[4, 8\\]"):
            plan_composed(c, size=MiB, collective=collective, variant=variant)
        return
    s = checked(plan_composed(c, size=64 * MiB, collective=collective, variant=variant), where)
    check_structure(s, c, where)
    if len(c.boxes) > 1 and any(box.gpus > 1 for box in c.boxes):
        assert s.meta["variant"] == variant


@pytest.mark.parametrize("kind", sorted(CLUSTERS))
def test_composed_verifies_on_small_clusters_of_every_shape(kind: str) -> None:
    for n in (1, 2, 5, 8):
        c = cluster(kind, n)
        for collective in COLLECTIVES:
            for variant in (None, "root"):
                where = f"{kind} with {n} ranks, {collective}, variant {variant}"
                s = checked(plan_composed(c, size=MiB, collective=collective,
                                          variant=variant), where)
                check_structure(s, c, where)
                assert s.nranks == n


# --------------------------------------------------------------------------------------
# The design, by hand
# --------------------------------------------------------------------------------------

def test_one_box_is_one_native_op_over_the_box() -> None:
    c = target("dgx_h100")
    for collective in COLLECTIVES:
        s = checked(plan_composed(c, size=MiB, collective=collective), "dgx_h100")
        assert s.meta["variant"] == "one box" and s.nsteps == 1
        ops = {op for _, _, op in natives(s)}
        assert ops == {Native(NativeKind(collective), tuple(range(8)), 0,
                              1 if collective == "allreduce" else 8)}
        assert s == plan_native(c, size=MiB, collective=collective)


def test_one_rank_plans_nothing() -> None:
    c = cluster("single-switch", 1)
    for collective in COLLECTIVES:
        for planner in (plan_composed, plan_native):
            s = planner(c, size=MiB, collective=collective)
            assert s.nops == 0 and s.nranks == 1


def test_boxes_of_one_gpu_are_the_cross_box_plan_alone() -> None:
    c = load_topology("ddl_two_switch")
    s = checked(plan_composed(c, size=256 * MiB), "ddl_two_switch")
    assert s.nnative == 0 and s.meta["cross"] == "mcf"
    assert set(s.meta["variants"]) == {"scatter"}  # one GPU a box: one variant
    assert s.meta["estimate_s"] == pytest.approx(
        simulate(c, plan(c, "mcf", size=256 * MiB), 256 * MiB).time_s, rel=1e-9)


def test_scatter_allreduce_is_reduce_scatter_exchange_allgather() -> None:
    c = load_topology("dgx_a100_x4")
    s = checked(plan_composed(c, size=256 * MiB, variant="scatter"), "dgx_a100_x4")
    assert s.meta["variants"]["scatter"]["units"] == 8
    for box in c.boxes:
        for r in box.ranks:
            steps = s.ranks[r].steps
            first, last = steps[0][0], steps[-1][0]
            assert isinstance(first, Native) and first.kind is NativeKind.REDUCE_SCATTER
            assert isinstance(last, Native) and last.kind is NativeKind.ALLGATHER
            assert first.group == last.group == tuple(box.ranks)
            assert (first.chunk, first.count) == (0, s.nchunks)
            # In between, GPU j talks only to GPU j of the other boxes (its rail).
            for step in steps[1:-1]:
                for op in step:
                    assert not isinstance(op, Native)
                    assert c.local_index(op.peer) == c.local_index(r)
                    assert c.box_index(op.peer) != c.box_index(r)


def test_root_allreduce_is_reduce_exchange_broadcast() -> None:
    c = load_topology("mn1_infiniband")
    s = checked(plan_composed(c, size=MiB, variant="root"), "mn1_infiniband")
    for box in c.boxes:
        root = box.first_rank + root_of(box)
        for r in box.ranks:
            steps = s.ranks[r].steps
            kinds = [steps[0][0].kind, steps[-1][0].kind]  # type: ignore[union-attr]
            assert kinds == [NativeKind.REDUCE, NativeKind.BROADCAST]
            assert steps[0][0].root == root  # type: ignore[union-attr]
            if r != root:
                assert len(steps) == 2  # only the root crosses the fabric


def test_unequal_boxes_split_into_the_lcm_of_their_sizes() -> None:
    c = target("unequal_gpus")  # two boxes of 8 GPUs, two of 4
    s = checked(plan_composed(c, size=256 * MiB, variant="scatter"), "unequal_gpus")
    units = s.meta["variants"]["scatter"]["units"]
    assert units == 8 and s.nchunks % units == 0
    per_unit = s.nchunks // units
    for box in c.boxes:
        op = s.ranks[box.first_rank].steps[0][0]
        assert isinstance(op, Native) and op.count == s.nchunks
        # GPU i of a 4-GPU box reduces units 2i and 2i + 1: equal parts of the buffer.
        for i in range(box.gpus):
            a, b = op.part(i)
            assert (a, b) == (i * s.nchunks // box.gpus, (i + 1) * s.nchunks // box.gpus)
            assert math.fsum(s.chunks[a:b]) == pytest.approx(1 / box.gpus)
            assert (b - a) % per_unit == 0


def test_the_box_level_cluster_carries_each_parts_share() -> None:
    c = target("unequal_nics")  # 8 NICs a fast box, 2 a slow one, 8 GPUs each
    sub = box_level_cluster(c, [0] * 4, 8)
    assert sub.nranks == 4 and [box.gpus for box in sub.boxes] == [1] * 4
    assert [sum(n.bandwidth for n in box.nics) for box in sub.boxes] == \
        pytest.approx([25e9, 25e9, 6.25e9, 6.25e9])
    whole = box_level_cluster(c, [0] * 4, None)  # the root's own NICs, whole
    assert [sum(n.bandwidth for n in box.nics) for box in whole.boxes] == \
        pytest.approx([25e9] * 4)
    two_leaf = target("two_leaf_oversubscribed")
    sub = box_level_cluster(two_leaf, [0] * 8, 8)
    assert [link.bandwidth for link in sub.links] == pytest.approx([100e9 / 8])
    assert {box.nics[0].switch for box in sub.boxes} == {"leaf0", "leaf1"}


def test_rails_leave_through_their_own_nic() -> None:
    c = load_topology("dgx_a100_x4")
    sub = box_level_cluster(c, [3] * 4, 8)
    assert all(box.nics[0].switch == "rail3" and len(box.nics) == 1 for box in sub.boxes)


def test_the_estimate_is_the_simulated_time_on_the_targets() -> None:
    # The planner's own estimate (in-box steps by the NCCL model of a box, the cross-box
    # plan simulated on the box-level cluster) against the simulator on the whole plan.
    for name in ("unequal_nics", "unequal_gpus"):
        c = target(name)
        s = plan_composed(c, size=256 * MiB)
        assert simulate(c, s, 256 * MiB).time_s == pytest.approx(s.meta["estimate_s"],
                                                                rel=0.05), name


# --------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"variant": "rails"}, "composed: variant must be one of scatter, root or None, got 'rails'"),
    ({"inner": "mcf"}, "composed: inner must be a list of planner names, got 'mcf'"),
    ({"inner": ["magic"]}, "composed: inner: unknown planner 'magic'; known: "),
    ({"inner": ["composed"]}, "composed: inner: 'composed' plans native steps, which cannot "
                              "be the cross-box exchange; usable: forest, hierarchical, "
                              "mcf, rhd, ring, ring-topo, tree"),
    ({"inner": ["nccl"]}, "composed: inner: 'nccl' plans native steps"),
    ({"collective": "alltoall"}, "composed: unknown collective 'alltoall'"),
    ({"size": 0}, "composed: size must be a positive number of bytes, got 0"),
    ({"max_chunks": 0}, "composed: max_chunks must be an integer >= 1 or None, got 0"),
])
def test_bad_arguments_are_named(kwargs: dict, message: str) -> None:
    c = load_topology("dgx_a100_x4")
    kwargs = {"size": MiB, **kwargs}
    with pytest.raises(PlannerError, match="^" + message.replace("(", r"\(")
                       .replace(")", r"\)").replace("[", r"\[")):
        plan_composed(c, **kwargs)


def test_inner_planners_that_do_not_plan_the_collective_are_named() -> None:
    c = load_topology("dgx_a100_x4")
    with pytest.raises(PlannerError, match="none of the cross-box planners tree, "
                                           "hierarchical plans reduce_scatter"):
        plan_composed(c, size=MiB, collective="reduce_scatter", inner=["tree", "hierarchical"])


def test_caps_are_met_or_the_one_it_cannot_meet_is_named() -> None:
    c = load_topology("dgx_a100_x4")
    for variant in ("scatter", "root"):
        s = plan_composed(c, size=256 * MiB, max_chunks=64, max_step_ops=4, variant=variant)
        assert s.nchunks <= 64 and s.max_step_ops <= 4
        checked(s, f"dgx_a100_x4 under caps, variant {variant}")
    # A reduce-scatter over 32 ranks needs a chunk per shard.
    with pytest.raises(InfeasiblePlanError, match=r"^composed: no planner could plan the "
                                                  r"cross-box exchange \(max_chunks over its 8 "
                                                  r"copies: 1 each\): .*max_chunks=1"):
        plan_composed(c, size=256 * MiB, collective="reduce_scatter", max_chunks=8)


def test_one_box_meets_caps_or_says_which() -> None:
    c = target("dgx_h100")
    with pytest.raises(InfeasiblePlanError, match="max_chunks=4"):
        plan_composed(c, size=MiB, collective="reduce_scatter", max_chunks=4)


def test_a_group_too_many_units_is_left_out_with_the_reason() -> None:
    sizes = [7, 8, 9]  # lcm 504 units
    body = "\n".join(f"  - {{name: b{b}, gpus: {g}, fabric: {{bandwidth: 100 GB/s}}, "
                     f"nics: [{{switch: sw, bandwidth: 10 GB/s}}]}}" for b, g in enumerate(sizes))
    c = loads_cluster(f"name: odd\nswitches: [sw]\nboxes:\n{body}\n")
    s = checked(plan_composed(c, size=MiB), "boxes of 7, 8, 9 GPUs")
    assert s.meta["variant"] == "root"
    assert "504 units, over 64" in s.meta["variants"]["scatter"]
    with pytest.raises(InfeasiblePlanError, match="504 units, over 64"):
        plan_composed(c, size=MiB, variant="scatter")


# --------------------------------------------------------------------------------------
# The nccl plan and auto
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("collective", COLLECTIVES)
def test_the_nccl_plan_prices_as_the_nccl_row(collective: str) -> None:
    for name in ("dgx_a100_x4", "ddl_two_switch", "ndv2_x2"):
        c = load_topology(name)
        s = checked(plan(c, "nccl", size=64 * MiB, collective=collective), name)
        assert s.nnative == c.nranks and s.nsteps == 1
        assert s.meta["nccl"]["time_s"] == nccl_time(c, 64 * MiB, collective).time_s
        report = simulate(c, s, 64 * MiB, profile="nccl")
        assert report.time_s == pytest.approx(nccl_time(c, 64 * MiB, collective).time_s,
                                              rel=1e-12)


@pytest.mark.parametrize("name", [n for n in SHIPPED if n not in ("leaf_spine_1024",
                                                                   "ddl_three_racks")])
def test_auto_is_never_slower_than_nccl(name: str) -> None:
    c = load_topology(name)
    for size in (1 << 10, MiB, 256 * MiB):
        schedule = plan(c, "auto", size=size, candidates=[*CHEAP, "nccl", "composed"])
        times = {row["algorithm"]: row["time_s"] for row in schedule.meta["comparison"]}
        # The nccl row is a candidate, priced as the NCCL model prices NCCL itself ...
        assert times["nccl"] == pytest.approx(nccl_time(c, size).time_s, rel=1e-12)
        # ... so the fastest candidate is never slower.
        assert times[schedule.meta["chosen"]] == min(times.values()) <= times["nccl"]
        assert schedule.meta["comparison"][0]["speedup_vs_nccl"] >= 1.0
        assert schedule.meta["nccl"]["time_s"] == pytest.approx(times["nccl"], rel=1e-12)


def test_the_nccl_row_is_the_compared_one_or_planned_on_its_own() -> None:
    c = load_topology("ndv2_x2")
    request = PlanRequest.make(c, size=MiB, profile="nccl")
    rows = compare(request, ["rhd", "nccl"])
    row = nccl_candidate(request, rows)
    assert row in rows and row.nccl is not None and row.schedule is not None
    alone = nccl_candidate(request, compare(request, ["rhd"]))
    assert alone.name == "nccl" and alone.time_s == row.time_s
    assert alone.nccl is not None and alone.nccl.label() == row.nccl.label()


def test_auto_picks_nccl_on_one_nvswitch_box_at_large_sizes() -> None:
    c = target("dgx_h100")
    for size in (64 * MiB, 256 * MiB, 1 << 30):
        schedule = plan(c, "auto", size=size)
        assert schedule.meta["chosen"] in ("nccl", "composed"), size
        times = {row["algorithm"]: row["time_s"] for row in schedule.meta["comparison"]}
        assert times[schedule.meta["chosen"]] <= times["nccl"]
        # No point-to-point plan comes near NVLS here.
        assert min(t for a, t in times.items() if a not in ("nccl", "composed")) > \
            1.2 * times["nccl"]
        assert schedule.nnative == 8 and schedule.nsteps == 1


def test_auto_picks_composed_where_nccl_passes_every_box() -> None:
    c = target("unequal_gpus")
    schedule = plan(c, "auto", size=256 * MiB)
    assert schedule.meta["chosen"] == "composed"
    times = {row["algorithm"]: row["time_s"] for row in schedule.meta["comparison"]}
    assert times["nccl"] > 1.3 * times["composed"]
    checked(schedule, "auto on unequal_gpus")


def test_plan_table_shows_one_nccl_row_and_can_choose_it(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    args = [sys.executable, "-m", "topoplan", "plan",
            str(TOPOLOGIES / "targets" / "dgx_h100.yaml"), "--size", "256MiB"]
    out = subprocess.run([*args, "--json", "-o", str(tmp_path / "p.json")],
                         capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    names = [c["algorithm"] for c in data["candidates"]]
    assert names.count("nccl") == 1 and "composed" in names
    assert data["chosen"] == "nccl"
    nccl = next(c for c in data["candidates"] if c["algorithm"] == "nccl")
    assert nccl["speedup_vs_nccl"] == pytest.approx(1.0)
    assert {"nccl_algorithm", "protocol", "channels"} <= set(nccl)
    saved = checked(schedule_from_dict(json.loads((tmp_path / "p.json").read_text())), "file")
    assert saved.nnative == 8
    table = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    assert "nccl *" in table and "chosen: nccl" in table
