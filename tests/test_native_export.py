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
from topoplan.errors import ScheduleError

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


# ---- the MSCCL export ------------------------------------------------------------------

def test_export_lowers_native_steps_and_says_so():
    from topoplan.interop.msccl import export_msccl, loads_msccl, to_xml
    from topoplan.interop.msccl.import_ import import_msccl

    result = export_msccl(two_boxes())
    assert result.notes[0].startswith("4 native collectives (8 native steps) lowered to "
                                      "point-to-point steps")
    algo = loads_msccl(to_xml(result.algo))
    assert (algo.coll, algo.ngpus) == ("allreduce", 4)
    from topoplan.ir.verify import verify

    assert verify(import_msccl(algo)).nnative == 0


@pytest.mark.parametrize("build", [lambda: N.rails(2, 4, part=2),
                                   lambda: N.composed_reduce_scatter(2, 2),
                                   lambda: N.composed_allgather(2, 2),
                                   lambda: N.rooted([[0, 1, 2], [3, 4]])])
def test_composed_schedules_export(build):
    from topoplan.interop.msccl import export_msccl

    result = export_msccl(build())
    assert "lowered to point-to-point" in result.notes[0]


def test_export_refuses_native_steps_when_told_not_to_lower():
    from topoplan.interop.msccl import export_msccl

    with pytest.raises(ScheduleError, match=r"rank 0 step 0 runs a native reduce_scatter over "
                                            r"\{0, 1\} of chunks 0..3; MSCCL XML has no "
                                            r"collective steps"):
        export_msccl(two_boxes(), lower=False)


def test_topoplan_export_notes_the_lowering_and_no_lower_refuses(tmp_path):
    plan, xml = tmp_path / "composed.json", tmp_path / "algo.xml"
    two_boxes().save(plan)
    done = _cli("export", str(plan), "-o", str(xml))
    assert done.returncode == 0, done.stderr
    assert "topoplan: note: 4 native collectives (8 native steps) lowered" in done.stderr
    assert xml.read_text().startswith("<algo ")
    done = _cli("export", str(plan), "--json")
    assert "lowered to point-to-point" in json.loads(done.stdout)["notes"][0]
    refused = tmp_path / "refused.xml"
    done = _cli("export", str(plan), "--no-lower", "-o", str(refused))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "MSCCL XML has no collective steps" in done.stderr and "--no-lower" in done.stderr
    assert not refused.exists()
