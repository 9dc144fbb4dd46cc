"""Units of bandwidth, latency and size (docs/CLUSTER.md: a bare number is GB/s for a bandwidth
and microseconds for a latency)."""

import math

import pytest

from topoplan.units import (format_bandwidth, format_size, format_time, parse_bandwidth,
                            parse_count, parse_latency, parse_size, parse_size_range)


@pytest.mark.parametrize("text, expected", [
    ("25 GB/s", 25e9),
    ("25GB/s", 25e9),
    ("1.5 TB/s", 1.5e12),
    ("800 MB/s", 800e6),
    ("100 Gbit/s", 12.5e9),
    ("100 Gb/s", 12.5e9),
    ("100 Gbps", 12.5e9),
    ("56 Gbit/s", 7e9),
    ("400 Mbit/s", 50e6),
    ("1e3 MB/s", 1e9),
    ("  10  GB/s  ", 10e9),
    (300, 300e9),  # a bare number is GB/s
    (12.5, 12.5e9),
    ("100", 100e9),  # also when quoted
])
def test_bandwidth_units(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("text, expected", [
    ("500 ns", 500e-9),
    ("2 us", 2e-6),
    ("2 µs", 2e-6),
    ("1.5 ms", 1.5e-3),
    ("0.25 s", 0.25),
    ("0 us", 0.0),
    (3, 3e-6),  # a bare number is microseconds
    (0.5, 0.5e-6),
    ("7", 7e-6),
])
def test_latency_units(text, expected):
    assert parse_latency(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("text, expected", [
    ("1KiB", 1024), ("256MiB", 256 << 20), ("1GiB", 1 << 30),
    ("4K", 4096), ("2M", 2 << 20), ("1G", 1 << 30),
    ("1.5K", 1536), ("4096", 4096), (4096, 4096), ("8 B", 8), ("1 MB", 10**6),
])
def test_sizes(text, expected):
    assert parse_size(text) == expected


def test_size_ranges():
    assert parse_size_range("1KiB:8KiB") == [1024, 2048, 4096, 8192]
    assert parse_size_range("1K:1M:4") == [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20]
    assert parse_size_range("8,64,1M") == [8, 64, 1 << 20]
    assert parse_size_range("256MiB") == [256 << 20]
    assert parse_size_range("3:3") == [3]


@pytest.mark.parametrize("text", ["1K:1M:x", "1M:1K", "0:1K", "1K:1M:1", "1:2:3:4"])
def test_bad_size_ranges(text):
    with pytest.raises(ValueError, match="not a size range"):
        parse_size_range(text)


@pytest.mark.parametrize("parse, text, message", [
    (parse_bandwidth, "10 GB/sec", "unknown unit 'GB/sec' in '10 GB/sec'; use one of B/s, KB/s"),
    (parse_bandwidth, "5 furlongs", "unknown unit 'furlongs'"),
    (parse_bandwidth, "fast", "not a bandwidth: 'fast'"),
    (parse_bandwidth, "", "not a bandwidth: ''"),
    (parse_bandwidth, True, "expected a bandwidth, got True"),
    (parse_bandwidth, [1], "expected a bandwidth, got list [1]"),
    (parse_bandwidth, math.inf, "expected a finite bandwidth, got inf"),
    (parse_bandwidth, "1e999 GB/s", "not a finite bandwidth"),
    (parse_latency, "3 hours", "unknown unit 'hours' in '3 hours'; use one of ns, us, µs, ms, s"),
    (parse_latency, "10 GB/s", "unknown unit 'GB/s'"),
    (parse_latency, math.nan, "expected a finite latency, got nan"),
    (parse_size, "12 parsecs", "unknown unit 'parsecs'"),
    (parse_size, "1.3", "a size must be a whole number of bytes >= 0, got '1.3'"),
    (parse_size, -5, "a size must be a whole number of bytes >= 0, got -5"),
])
def test_unknown_or_bad_units(parse, text, message):
    with pytest.raises(ValueError) as info:
        parse(text)
    assert message in str(info.value)


def test_formatting_round_trips():
    assert format_size(256 << 20) == "256MiB"
    assert format_size(1536) == "1.5KiB"
    assert format_size(100) == "100B"
    assert parse_size(format_size(64 << 30)) == 64 << 30
    assert format_bandwidth(25e9) == "25 GB/s"
    assert format_bandwidth(12.5e9) == "12.5 GB/s"
    assert format_bandwidth(1.6e12) == "1.6 TB/s"
    assert parse_bandwidth(format_bandwidth(3.125e9)) == 3.125e9
    assert format_time(0.00123) == "1.23 ms"
    assert format_time(0) == "0 s"
    assert format_time(2e-6) == "2 us"
    assert parse_latency(format_time(5e-7)) == pytest.approx(5e-7)


@pytest.mark.parametrize("parse, example", [(parse_size, "256MiB"), (parse_bandwidth, "25 GB/s"),
                                            (parse_latency, "2 us")])
def test_unparsable_values_show_an_example(parse, example):
    with pytest.raises(ValueError, match=f"e.g. {example}"):
        parse("garbage")


@pytest.mark.parametrize("text, count", [("1.5e9", 1_500_000_000), ("1.5B", 1_500_000_000),
                                         ("1.5G", 1_500_000_000), ("350M", 350_000_000),
                                         ("7b", 7_000_000_000), ("2T", 2 * 10**12),
                                         ("64K", 64_000), (25_557_032, 25_557_032)])
def test_counts_read_as_people_write_them(text, count):
    assert parse_count(text) == count


@pytest.mark.parametrize("text, message", [("0", "whole number >= 1"), ("0.5", "whole number"),
                                           ("1.23456789012B", "whole number"),
                                           ("1.5X", "e.g. 350M, 1.5B"), ("-7B", "not a count"),
                                           (True, "expected a count")])
def test_bad_counts_say_what_a_count_is(text, message):
    with pytest.raises(ValueError, match=message):
        parse_count(text)
