"""Print a hash of every candidate ``auto`` offers on a few clusters (healthy and with a
slow link), as each rank of a job plans them for itself (tests/test_plans_agree.py).

Everything is planned twice, with other objects allocated in between, so that a tie
broken by an object's address shows within one process too. Timing fields (``*_s``)
are left out of the hash: they are how long planning took."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from topoplan.analysis.cost import get_profile  # noqa: E402
from topoplan.cluster import load_cluster, loads_cluster  # noqa: E402
from topoplan.cluster.links import degraded  # noqa: E402
from topoplan.runtime.choice import model_options  # noqa: E402

from bench_online import CUTS  # noqa: E402  (the testbed's 4-GPU NVLink mesh)

TIMING = re.compile(r'"\w+_s": [-+0-9.eE]+')


def main() -> None:
    cube = loads_cluster(CUTS["cube"], "cube.yaml")
    crossed = load_cluster(ROOT / "topologies" / "targets" / "ddl_two_switch_crossed.yaml")
    doctor = load_cluster(ROOT / "tests" / "data" / "doctor" / "doctor_6.yaml")
    settings = [(cube, {}), (cube, {"dgx1/gpu0-gpu1": 0.25}), (crossed, {}),
                (doctor, {"leaf0-leaf1": 0.25})]
    for cluster, slow in settings:
        cluster = degraded(cluster, slow) if slow else cluster
        for profile in ("mpi", "gloo"):
            for size in (1 << 16, 1 << 21):
                options, chosen = model_options(cluster, size, profile=get_profile(profile),
                                                machine=cluster.scaled(0.01))
                hashes = [o.algorithm + ":" + hashlib.sha1(
                    TIMING.sub("", o.schedule.to_json()).encode()).hexdigest()[:12]
                    for o in options]
                print(cluster.name, profile, size, chosen, *hashes)


if __name__ == "__main__":
    main()
    junk = [object() for _ in range(1000)]  # move later objects to other addresses
    main()
