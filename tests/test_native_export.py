"""Native steps (IR v3) in the MSCCL export: lowered to point-to-point steps (and said so),
or refused with ``--no-lower``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import native_programs as N
from tests.test_schedule_native import two_boxes
from topoplan.cluster import Cluster, loads_cluster
from topoplan.errors import ScheduleError

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


# ---- the MSCCL export ------------------------------------------------------------------

def boxes(*sizes: int) -> Cluster:
    """Boxes of ``sizes`` GPUs on an NVSwitch-like fabric, one 100 Gbit/s NIC each, on one
    switch: the cluster the hand-built composed schedules are for."""
    lines = ["name: boxes", "switches: [{name: sw}]", "boxes:"]
    lines += [f"  - {{name: b{i}, gpus: {g}, fabric: {{bandwidth: 200 GB/s, latency: 1 us}}, "
              "nics: [{switch: sw, bandwidth: 100 Gbit/s, latency: 2 us}]}"
              for i, g in enumerate(sizes)]
    return loads_cluster("\n".join(lines) + "\n")


def test_export_lowers_native_steps_and_says_so():
    from topoplan.interop.msccl import export_msccl, loads_msccl, to_xml
    from topoplan.interop.msccl.import_ import import_msccl

    result = export_msccl(two_boxes(), cluster=boxes(2, 2), size=MiB)
    assert result.notes[0].startswith("4 native collectives (8 native steps) written as "
                                      "point-to-point steps")
    assert result.prediction is not None and result.prediction.size == MiB
    algo = loads_msccl(to_xml(result.algo))
    assert (algo.coll, algo.ngpus) == ("allreduce", 4)
    from topoplan.ir.verify import verify

    assert verify(import_msccl(algo)).nnative == 0


@pytest.mark.parametrize("build, sizes", [(lambda: N.rails(2, 4, part=2), (4, 4)),
                                          (lambda: N.composed_reduce_scatter(2, 2), (2, 2)),
                                          (lambda: N.composed_allgather(2, 2), (2, 2)),
                                          (lambda: N.rooted([[0, 1, 2], [3, 4]]), (3, 2))])
def test_composed_schedules_export(build, sizes):
    from topoplan.interop.msccl import export_msccl

    result = export_msccl(build(), cluster=boxes(*sizes), size=MiB, max_slowdown=100)
    assert "written as point-to-point steps" in result.notes[0]


def test_export_refuses_native_steps_when_told_not_to_lower():
    from topoplan.interop.msccl import export_msccl

    with pytest.raises(ScheduleError, match=r"rank 0 step 0 runs a native reduce_scatter over "
                                            r"\{0, 1\} of chunks 0..3; MSCCL XML has no "
                                            r"collective steps"):
        export_msccl(two_boxes(), lower=False)


def test_export_of_native_steps_needs_the_cluster():
    from topoplan.interop.msccl import export_msccl

    with pytest.raises(ScheduleError, match=r"written as the rings NCCL runs on the cluster, "
                                            r"whose time the export checks against the native "
                                            r"step's: give the plan's cluster"):
        export_msccl(two_boxes())


def test_topoplan_export_notes_the_lowering_and_no_lower_refuses(tmp_path):
    plan, xml, cluster = tmp_path / "composed.json", tmp_path / "algo.xml", tmp_path / "c.yaml"
    two_boxes().save(plan)
    cluster.write_text(_BOXES_2_2)
    done = _cli("export", str(plan), "--cluster", str(cluster), "--size", "1MiB",
                "-o", str(xml))
    assert done.returncode == 0, done.stderr
    assert "topoplan: note: 4 native collectives (8 native steps) written as" in done.stderr
    assert "x the native steps'" in " ".join(done.stdout.split())
    assert xml.read_text().startswith("<algo ")
    done = _cli("export", str(plan), "--cluster", str(cluster), "--size", "1MiB", "--json")
    data = json.loads(done.stdout)
    assert "written as point-to-point steps" in data["notes"][0]
    assert data["prediction"]["size_bytes"] == MiB and data["prediction"]["slowdown"] > 0
    missing = _cli("export", str(plan), "-o", str(tmp_path / "none.xml"))
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1
    assert "--cluster CLUSTER.yaml" in missing.stderr
    refused = tmp_path / "refused.xml"
    done = _cli("export", str(plan), "--no-lower", "-o", str(refused))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "MSCCL XML has no collective steps" in done.stderr and "--no-lower" in done.stderr
    assert not refused.exists()


_BOXES_2_2 = ("name: boxes\nswitches: [{name: sw}]\nboxes:\n"
              "  - {name: 'b{i}', count: 2, gpus: 2, fabric: {bandwidth: 200 GB/s, latency: 1 us}, "
              "nics: [{switch: sw, bandwidth: 100 Gbit/s, latency: 2 us}]}\n")


# ---- what NCCL would run there: a 4 x 8 rail cluster -------------------------------------

@pytest.fixture(scope="module")
def rail_nccl():
    """The nccl plan (one native allreduce over all 32 GPUs) on 4 boxes of 8 GPUs, GPU j of
    every box on rail j, spines above; 64 MiB."""
    from topoplan.cluster.generate import rail_optimized
    from topoplan.planners import plan

    cluster = loads_cluster(rail_optimized(4, 8), "<rail 4 x 8>")
    return cluster, plan(cluster, "nccl", size=64 * MiB)


def test_a_native_allreduce_exports_as_nccls_rings_not_an_all_to_all(rail_nccl):
    """It used to be lowered to a direct exchange (one chunk, 32 members: every GPU sent
    the whole buffer to every other): re-imported and simulated, 128x the bound and 67x
    slower than NCCL, and the export said "checked". Now: NCCL's rings, one per rail,
    crossing between boxes on their rails, with the prediction said."""
    from topoplan.analysis.sim import simulate
    from topoplan.interop.msccl import export_msccl, loads_msccl, to_xml
    from topoplan.interop.msccl.import_ import import_msccl

    cluster, schedule = rail_nccl
    result = export_msccl(schedule, cluster=cluster)
    assert "8 rings over every GPU, one per rail" in result.notes[0]
    back = import_msccl(loads_msccl(to_xml(result.algo)))
    report = simulate(cluster, back, 64 * MiB)
    nccl = schedule.meta["nccl"]["time_s"]
    # Measured: 2.05 ms, 4.07x the bound, 2.14x NCCL's 0.957 ms (Ring/LL128 x16).
    assert report.time_s / report.lower_bound_s < 5
    assert report.time_s / nccl < 2.5
    prediction = result.prediction
    assert prediction.exported_s == pytest.approx(report.time_s, rel=1e-6)
    assert prediction.native_s == pytest.approx(nccl, rel=1e-6)
    assert prediction.text().endswith(f"{prediction.slowdown:.2f}x the native steps' "
                                      "957 us (NCCL: Ring/LL128 x16)")
    assert result.serves().endswith("the plan's 64MiB (16777216 float32 elements) is one")


def test_export_refuses_rings_over_max_slowdown(rail_nccl):
    from topoplan.errors import PlannerError
    from topoplan.interop.msccl import export_msccl

    cluster, schedule = rail_nccl
    with pytest.raises(PlannerError, match=r"topoplan-nccl: the native steps, written as "
                                           r"point-to-point steps \(8 rings .*\), would be "
                                           r"2.1x slower: predicted 2.047 ms at 64MiB on "
                                           r"rail-32 .*over max_slowdown 1.5"):
        export_msccl(schedule, cluster=cluster, max_slowdown=1.5)


def test_small_messages_export_as_a_tree(rail_nccl):
    """At 1 MiB a ring's 62 steps of message latency outweigh the bytes: the binomial tree
    (reduce, then broadcast) is faster, as NCCL's Tree is there, and is written."""
    from topoplan.interop.msccl import export_msccl

    cluster, schedule = rail_nccl
    result = export_msccl(schedule, cluster=cluster, size=MiB, max_slowdown=10)
    assert "a binomial tree for each allreduce" in result.notes[0]
    assert result.algo.nchunksperloop == 1  # a tree moves the whole range: any count
