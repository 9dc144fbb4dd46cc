"""The NCCL model (topoplan.analysis.native.nccl) against published nccl-tests figures.

Every row is a published measurement: a cluster as its source describes it (GPU model,
NVLink per GPU from the datasheet, NICs), the collective, the size, what NCCL was told
(NCCL_ALGO, a tuner plugin, or its own choice) and the bus bandwidth nccl-tests printed.
The figures live in ``scripts/nccl_published.py`` as curves: one cluster, many
(size, busbw) points, a source; a single figure is a curve of one point. The model is
built from NCCL's source and the datasheets only; none of these figures set anything in
it. Targets: every figure of 1 MiB and more within 15% of the published busbw (or inside
a published range), latency rows within 1.5x.

    python scripts/bench_nccl_model.py                  # the table
    python scripts/bench_nccl_model.py --json           # the rows as JSON
    python scripts/bench_nccl_model.py --only p5        # rows whose name or group holds "p5"
    python scripts/bench_nccl_model.py --measured-version  # the version each source ran

Every row is priced with the tables of the NCCL version docs/NCCL_MODEL.md names (the
model's default). With ``--measured-version`` a row whose source names the NCCL version
it ran asks the model for that version's tables (``nccl_model(..., version=)``) where the
model knows it. The JSON says which (``model_version``; null: the default).

docs/NCCL_MODEL.md holds the table this prints, with the sources.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from topoplan.cluster import loads_cluster  # noqa: E402
from topoplan.analysis.native.nccl import nccl_model  # noqa: E402
from nccl_published import (CURVES, LATENCY, GiB, MiB, Curve, Latency,  # noqa: E402,F401
                            box_cluster, pair_cluster)

TOLERANCE = 0.15        # figures of 1 MiB and more
LATENCY_FACTOR = 1.5    # latency rows


_CLUSTERS: dict[str, object] = {}


def _cluster(text: str, name: str):
    """The cluster of ``text``, read once (a curve's points share it)."""
    if text not in _CLUSTERS:
        _CLUSTERS[text] = loads_cluster(text, name)
    return _CLUSTERS[text]


def model_for(text: str, name: str, version: str | None):
    """The model of cluster ``text`` and the version it was asked for (None: its default,
    also where it does not take a version or has no tables for this one)."""
    cluster = _cluster(text, name)
    if version:
        try:
            return nccl_model(cluster, version=version), version
        except ValueError:      # a version the model has no tables for
            pass
    return nccl_model(cluster), None


def predict(curve: Curve, size: int, version: str | None):
    """The model's choice where the measurement forced one (else NCCL's own), NCCL's own
    choice, and the model version used."""
    model, used = model_for(curve.cluster, curve.what, version)
    own = model.choose(curve.collective, size)
    algo, proto = curve.forced(size)
    if algo is None and proto is None:
        return own, own, used
    choice = min((c for c in model.candidates(curve.collective, size)
                  if (algo is None or c.algorithm == algo)
                  and (proto is None or c.protocol == proto)),
                 key=lambda c: c.tuner_time_s)
    return choice, own, used


def within(value: float, low: float, high: float, tolerance: float = TOLERANCE) -> bool:
    return low * (1 - tolerance) <= value <= high * (1 + tolerance)


def ratio_to(value: float, low: float, high: float) -> float:
    """``value`` over the published figure, or over the nearer end of a range."""
    return value / (low if value < low else high if value > high else value)


def size_text(size: int) -> str:
    return (f"{size >> 30}G" if size >= GiB else f"{size >> 20}M" if size >= MiB
            else f"{size >> 10}K" if size >= 1024 else f"{size}B")


def _selected(only: str | None, *names: str) -> bool:
    return not only or any(only.lower() in n.lower() for n in names)


def measure(only: str | None = None, versions: bool = True) -> list[dict]:
    """Every row: the model's figure, the published one, their ratio, what it runs."""
    out = []
    for curve in CURVES:
        if not _selected(only, curve.what, curve.group):
            continue
        version = curve.nccl_version if versions else None
        for index, (size, (low, high)) in enumerate(curve.points):
            choice, own, used = predict(curve, size, version)
            busbw, own_busbw = choice.busbw / 1e9, own.busbw / 1e9
            ratio = ratio_to(busbw, low, high)
            algo, proto = curve.forced(size)
            forced = " ".join(f"{k}={v}" for k, v in (("NCCL_ALGO", algo),
                                                      ("NCCL_PROTO", proto)) if v)
            out.append({"what": curve.what, "group": curve.group, "size": size,
                        "point": index, "points_in_curve": len(curve.points),
                        "forced": forced or None, "nccl": choice.label(),
                        "algorithm": choice.algorithm, "protocol": choice.protocol,
                        "nccl_alone": own.label(),
                        "nccl_alone_busbw_GBps": round(own_busbw, 1),
                        "nccl_alone_within_15pct": within(own_busbw, low, high),
                        "predicted_busbw_GBps": round(busbw, 1),
                        "published_busbw_GBps": [low, high], "ratio": round(ratio, 3),
                        "within_15pct": within(busbw, low, high),
                        "counts": size >= MiB,
                        "within_target": size < MiB or within(busbw, low, high),
                        "source": curve.source, "measured_with": curve.measured_with,
                        "nccl_version": curve.nccl_version, "model_version": used,
                        "note": curve.note})
    for row in LATENCY:
        if not _selected(only, row.what, row.group):
            continue
        version = row.nccl_version if versions else None
        model, used = model_for(row.cluster, row.what, version)
        choice = model.choose("allreduce", row.size)
        us = choice.time_s * 1e6
        low, high = row.published_us
        ratio = ratio_to(us, low, high)
        out.append({"what": row.what, "group": row.group, "size": row.size, "point": 0,
                    "points_in_curve": 1, "forced": None, "nccl": choice.label(),
                    "algorithm": choice.algorithm, "protocol": choice.protocol,
                    "nccl_alone": choice.label(), "predicted_us": round(us, 1),
                    "published_us": [low, high], "ratio": round(ratio, 3),
                    "within_15pct": within(us, low, high), "counts": True,
                    "within_target": 1 / LATENCY_FACTOR <= ratio <= LATENCY_FACTOR,
                    "source": row.source, "measured_with": row.measured_with,
                    "nccl_version": row.nccl_version, "model_version": used,
                    "note": row.note})
    return out


def summary(rows: list[dict]) -> list[str]:
    """One line per group: the figures of 1 MiB and more within 15%, the latency rows
    within 1.5x (and, where every row was forced, NCCL's own choice beside it)."""
    lines = []
    for group in dict.fromkeys(r["group"] for r in rows):
        members = [r for r in rows if r["group"] == group and r["counts"]]
        hits = sum(r["within_target"] for r in members)
        target = "within 1.5x" if group == "latency" else "within 15%"
        text = f"{group}: {hits} of {len(members)} {target}"
        busbw = [r for r in members if "nccl_alone_within_15pct" in r]
        forced = [r for r in busbw if r["forced"]]
        if forced and len(forced) == len(busbw):
            alone = sum(r["nccl_alone_within_15pct"] for r in forced)
            text += f"; priced as NCCL alone would choose, {alone} of {len(forced)}"
        lines.append(text)
    figures = [r for r in rows if r["counts"] and "published_busbw_GBps" in r]
    latency = [r for r in rows if "published_us" in r]
    lines.append(f"all: {sum(r['within_target'] for r in figures)} of {len(figures)} "
                 f"figures >= 1 MiB within 15%; {sum(r['within_target'] for r in latency)} "
                 f"of {len(latency)} latency rows within 1.5x")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--only", metavar="SUBSTRING",
                        help="only the rows whose measurement or group holds SUBSTRING "
                             "(any case)")
    parser.add_argument("--measured-version", action="store_true",
                        help="price each row with the tables of the NCCL version its source "
                             "ran, where the model knows it (default: the model's default)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    rows = measure(args.only, versions=args.measured_version)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("NCCL model against published nccl-tests figures (busbw GB/s; latency rows in us)")
    print(f"{'measurement':36} {'size':>5} {'model runs':26} {'tables':>6} {'model':>7} "
          f"{'published':>9} {'ratio':>6}")
    for r in rows:
        pred = r.get("predicted_busbw_GBps", r.get("predicted_us"))
        pub = r.get("published_busbw_GBps", r.get("published_us"))
        pub_text = f"{pub[0]:g}" if pub[0] == pub[1] else f"{pub[0]:g}-{pub[1]:g}"
        mark = "" if r["within_target"] else "  (miss)"
        label = r["nccl"] + (" forced" if r["forced"] else "")
        tables = r["model_version"] or "dflt"
        print(f"{r['what'][:36]:36} {size_text(r['size']):>5} {label[:26]:26} {tables:>6} "
              f"{pred:7.1f} {pub_text:>9} {r['ratio']:6.2f}{mark}")
    for line in summary(rows):
        print(line)
    print(f"ratio: the model over the published figure (or over the nearer end of a range); "
          f"'forced': what the measurement ran by NCCL_ALGO/NCCL_PROTO or a tuner plugin; "
          f"tables: the NCCL version the model priced (dflt: its default); "
          f"{time.perf_counter() - t0:.1f} s")
    for source in dict.fromkeys((r["what"], r["source"], r["note"]) for r in rows):
        what, text, note = source
        print(f"  - {what}: {text}" + (f"; {note}" if note else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
