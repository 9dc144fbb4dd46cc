"""``topoplan verify PLAN.json``: check that a schedule computes its collective (an allreduce,
a reduce-scatter or an allgather), and with ``--cluster`` that the certificate it records
holds."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from ..errors import ScheduleError, TopoplanError
from ..ir.parse import load_schedule
from ..ir.schedule import Schedule
from ..ir.verify import VerifyReport, verify
from .common import add_nccl_arguments, console, plan_name, plural

if TYPE_CHECKING:
    from ..planners.certificate import Certificate


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify", help="check a schedule JSON: exit 0 when it computes its collective "
                       "(allreduce, reduce_scatter or allgather)",
        description="Symbolically execute schedule(s) (the semantics of docs/SCHEDULE.md). Exit 0 "
                    "and print one line per file when correct; otherwise name the first "
                    "violation.")
    parser.add_argument("plan", nargs="+", help="schedule JSON file(s)")
    parser.add_argument("--cluster", metavar="CLUSTER.yaml",
                        help="also recompute each plan's certificate on this cluster (the "
                             "bound it is measured against and its gap, its time simulated: "
                             "docs/SCHEDULE.md, 'The certificate') and fail when the one it "
                             "records does not hold")
    parser.add_argument("--profile", default=None, metavar="NAME|FILE",
                        help="with --cluster: the cost profile to simulate under (default: "
                             "the one the plan records in its meta)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: every file with ok and what it computes, "
                             "or its error")
    add_nccl_arguments(parser)
    parser.set_defaults(func=cmd_verify)


def verify_plan(schedule: Schedule, path: str) -> VerifyReport:
    """:func:`~topoplan.ir.verify.verify` ``schedule``, read from ``path``: the error names
    the file (``PATH: ring schedule: rank 3 ...``), as every command that refuses a plan
    that does not verify words it."""
    try:
        return verify(schedule)
    except ScheduleError as exc:
        raise ScheduleError(f"{path}: {exc}") from None


def check_certificate(schedule: Schedule, path: str, cluster: Any,
                      profile: str | None) -> Certificate | None:
    """Recompute ``schedule``'s certificate on ``cluster``
    (:func:`~topoplan.planners.certificate.recompute`) and check the one it records in
    ``meta["certificate"]``, if any (:func:`~topoplan.planners.certificate.check`).

    Raises
    ------
    ScheduleError
        The recorded certificate does not hold, or it cannot be recomputed (naming
        ``path`` and why).
    """
    from ..planners.certificate import check, recompute
    actual = recompute(schedule, cluster, profile=profile, where=path)
    if "certificate" in schedule.meta:
        try:
            check(schedule.meta["certificate"], actual, where=path)
        except ScheduleError as exc:
            recorded = schedule.meta.get("profile")
            if profile is None or profile == recorded:
                raise
            raise ScheduleError(f"{exc} (recomputed under --profile {profile}; it was "
                                f"planned under {recorded!r})") from None
    return actual


def cmd_verify(args: argparse.Namespace) -> int:
    out = console()
    plans: list[dict[str, Any]] = []
    cluster = None
    if args.cluster:
        from ..cluster import load_cluster
        cluster = load_cluster(args.cluster)
    for path in args.plan:
        certificate: Certificate | None = None
        try:
            schedule = load_schedule(path)  # format errors already name the file
            report = verify_plan(schedule, path)
            if cluster is not None:
                certificate = check_certificate(schedule, path, cluster, args.profile)
        except TopoplanError as exc:
            if not args.json:
                raise
            plans.append({"file": path, "ok": False, "error": str(exc)})
            continue
        plans.append({"file": path, "ok": True, "algorithm": schedule.algorithm,
                      "collective": report.collective, "nranks": report.nranks,
                      "nchunks": report.nchunks, "nsteps": report.nsteps,
                      "nmessages": report.nmessages, "nnative": report.nnative,
                      "ncollectives": report.ncollectives})
        if cluster is not None:
            plans[-1].update(
                certificate=None if certificate is None else certificate.to_dict(),
                certificate_recorded="certificate" in schedule.meta)
        if not args.json:
            # Native steps (IR v3): one per member of each native collective.
            natives = (f", {plural(report.nnative, 'native step')} "
                       f"({plural(report.ncollectives, 'collective')})"
                       if report.nnative else "")
            out.print(f"{path}: ok: {plan_name(schedule)} {report.collective}, "
                      f"{plural(report.nranks, 'rank')}, {plural(report.nchunks, 'chunk')}, "
                      f"{plural(report.nsteps, 'step')}, "
                      f"{plural(report.nmessages, 'message')}{natives}", soft_wrap=True)
            if cluster is not None:
                out.print(_certificate_line(schedule, path, certificate), soft_wrap=True)
    if args.json:
        print(json.dumps({"plans": plans}))
    return 0 if all(p["ok"] for p in plans) else 1


def _certificate_line(schedule: Schedule, path: str, certificate: Certificate | None) -> str:
    """What ``--cluster`` found: the certificate holds, or there was none to check."""
    from ..planners.certificate import planner_of
    if certificate is None:
        return f"{path}: no certificate: one GPU moves nothing"
    text = certificate.text(planner_of(schedule))
    if "certificate" in schedule.meta:
        return f"{path}: certificate holds: {text}"
    return f"{path}: certificate (none recorded): {text}"
