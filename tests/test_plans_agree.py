"""Ranks that plan for themselves plan alike: ``PlannedAllreduce`` without ``share`` has
each rank call the planners, so a tie broken by anything that differs between processes
(an object's address, a set's hash order) gives ranks different schedules, which then
hang or compute wrong sums. Four processes with different hash seeds plan ``auto``'s
candidates on clusters with ties (the cube's equal NVLinks, a slowed link) and must print
the same schedules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_process_plans_the_same_schedules() -> None:
    script = ROOT / "tests" / "support" / "plan_hashes.py"
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=os.environ | {"PYTHONHASHSEED": str(seed)})
             for seed in (1, 2, 3, 4)]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        outs.append(out.splitlines())
    assert len(outs[0]) == 32
    assert outs[0][:16] == outs[0][16:], "one process planned otherwise the second time"
    for k, lines in enumerate(outs[1:], 2):
        differ = [(a, b) for a, b in zip(outs[0], lines) if a != b]
        assert not differ, f"process {k} planned otherwise: {differ[:2]}"
