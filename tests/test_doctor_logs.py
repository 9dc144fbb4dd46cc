"""topoplan.analysis.doctor.logs: nccl-tests output (both layouts), topoplan bench and
testbed bench JSON, CSV; every unreadable line a located error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topoplan.analysis.doctor import DoctorLogError, parse_log, read_log

DATA = Path(__file__).parent / "data" / "doctor"

NEW = """\
# nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  28307 on      gpu59 device  0 [0x16] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  28307 on      gpu59 device  1 [0x27] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    42.56    0.00    0.00      0    41.10    0.00    0.00      0
gpu59:28307:28307 [0] NCCL INFO Channel 00/02 : 0 1
     1048576        262144     float     sum      -1    20.00   52.43   52.43      0    25.00   41.94   41.94    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 26.2
"""

OLD = """\
$ mpirun -np 2 ./build/all_gather_perf -b 8 -e 128M -f 2 -g 1
 nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20
#                                                     out-of-place                       in-place
#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)             (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        131072   float    47.38   22.13   11.06  0e+00    46.84   22.39   11.19  0e+00
     2097152        262144   float    70.44   29.77   14.89  0e+00    69.77   30.06   15.03  0e+00
"""


def test_nccl_tests_takes_the_faster_place_and_counts_the_rank_lines():
    log = parse_log(NEW, "a.log")
    assert log.format == "nccl-tests" and log.nranks == 2 and log.collective == "allreduce"
    assert [p.size for p in log.points] == [8, 1048576]
    assert log.points[0].time_s == pytest.approx(41.10e-6)      # in-place was faster
    assert log.points[1].time_s == pytest.approx(20.00e-6)      # out-of-place was
    assert log.points[1].busbw == pytest.approx(52.43e9)
    assert log.points[1].line == 12
    assert "read from its count" in log.notes[0]


def test_nccl_tests_place_in_and_out():
    assert parse_log(NEW, place="in").points[1].time_s == pytest.approx(25e-6)
    assert parse_log(NEW, place="out").points[0].time_s == pytest.approx(42.56e-6)


def test_the_old_layout_without_root_and_the_binary_named():
    log = parse_log(OLD, "old.log")
    assert log.collective == "allgather"
    assert log.nranks is None          # no Rank lines: nThread x nGpus is per process
    assert [p.time_s for p in log.points] == pytest.approx([46.84e-6, 69.77e-6])


def test_the_published_style_tagged_rows():
    text = NEW.replace("           8             2     float     sum      -1",
                       "[0]           8             2     float     sum      -1[0]")
    assert parse_log(text).points[0].time_s == pytest.approx(41.10e-6)


@pytest.mark.parametrize("cut, what, line", [
    (lambda t: t.replace("41.94   41.94    N/A", "41.94"), "a.log:12: truncated row", 12),
    (lambda t: t.replace("20.00   52.43", "20.x0   52.43"), "a.log:12: garbled row", 12),
    (lambda t: t.replace("      0    41.10", "  0 7    41.10"), "a.log:10: garbled row", 10),
])
def test_a_bad_row_is_a_located_error(cut, what, line):
    with pytest.raises(DoctorLogError) as err:
        parse_log(cut(NEW), "a.log")
    assert str(err.value).startswith(what) and err.value.line == line


def test_no_rows_and_no_header_are_one_clear_error():
    head = NEW.split("           8 ")[0]
    with pytest.raises(DoctorLogError, match="no data rows"):
        parse_log(head, "a.log")
    with pytest.raises(DoctorLogError, match="not a log topoplan doctor reads"):
        parse_log("hello\nworld\n", "b.log")


def test_csv_with_units_and_comments():
    log = read_log(DATA / "nccl_2409.csv")
    assert log.format == "csv" and [p.size for p in log.points] == [1 << 30, 8 << 30]
    assert log.points[0].busbw == pytest.approx(216.5e9) and log.points[0].time_s is None
    with pytest.raises(DoctorLogError, match=r"x.csv:3: garbled row: busbw"):
        parse_log("size,busbw\n1MiB,3\n2MiB,fast\n", "x.csv")
    with pytest.raises(DoctorLogError, match=r"x.csv:2: size '1QiB'"):
        parse_log("size,busbw\n1QiB,3\n", "x.csv")


def test_topoplan_bench_json():
    doc = {"schedule": {"algorithm": "ring", "nranks": 8, "cluster": "c"},
           "collective": "allreduce", "transport": "nccl",
           "rows": [{"size": 1024, "time_us": 10.0, "busbw": 0.18, "native_time_us": 8.0,
                     "native_busbw": 0.22}]}
    log = parse_log(json.dumps(doc), "b.json")
    assert log.format == "topoplan-bench" and log.nranks == 8
    assert log.algorithms == ("ring", "nccl")
    with pytest.raises(DoctorLogError, match="b.json:1: not valid JSON"):
        parse_log(json.dumps(doc)[:40], "b.json")
    with pytest.raises(DoctorLogError, match=r"rows\[0\]: no 'time_us'"):
        parse_log(json.dumps({"rows": [{"size": 8}]}), "b.json")


def test_testbed_bench_json():
    doc = {"transport": "gloo", "collective": "allreduce", "cluster": "two-switch",
           "nranks": 8, "scale": 0.01, "calibration": None,
           "rows": [{"algorithm": "ring", "size": 4096, "measured_s": 1e-3,
                     "predicted_s": 8e-4, "calibrated_s": None},
                    {"algorithm": "native", "size": 4096, "measured_s": 2e-3,
                     "predicted_s": None}]}
    log = parse_log(json.dumps(doc), "t.json")
    assert log.format == "testbed-bench" and log.nranks == 8 and log.scale == 0.01
    assert log.algorithms == ("ring", "native") and log.cluster == "two-switch"
    assert log.points[0].predicted_s == pytest.approx(8e-4)
    assert any("native rows" in n for n in log.notes)
