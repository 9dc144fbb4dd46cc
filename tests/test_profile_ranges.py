"""The ranges a cost profile's numbers may take (docs/COST_MODEL.md, "Ranges").

The cluster file's treatment (tests/test_cluster_ranges.py), with the same machinery
(:class:`topoplan.units.QuantityRange`): outside the plausible range a value is a
:class:`RangeWarning`; beyond what topoplan's arithmetic carries (NaN, infinite, negative,
absurdly large) a :class:`ProfileError` naming ``file:line: key`` and the range, whether
the profile is a file or is built in code.
"""

from __future__ import annotations

import math
import warnings

import pytest

from topoplan.analysis.cost import CostProfile, NativeCost, get_profile, loads_profile
from topoplan.analysis.cost.profile import PROFILE_RANGES
from topoplan.analysis.cost.read import profile_names
from topoplan.cli import main
from topoplan.errors import ProfileError, RangeWarning, TopoplanWarning
from topoplan.units import BANDWIDTH_RANGE

# Where each numeric field sits in a profile: the YAML text with VALUE where the number
# goes, and the key an error names.
FIELDS = {
    "alpha": ("alpha: VALUE", "alpha", "time"),
    "alpha.box": ("alpha: {box: VALUE, network: 1 us}", "alpha.box", "time"),
    "alpha.network": ("alpha: {box: 1 us, network: VALUE}", "alpha.network", "time"),
    "small alpha": ("small_messages: {max_bytes: 4096, alpha: VALUE}",
                    "small_messages.alpha", "time"),
    "op_overhead": ("op_overhead: VALUE", "op_overhead", "time"),
    "step_overhead": ("step_overhead: VALUE", "step_overhead", "time"),
    "call_overhead": ("call_overhead: VALUE", "call_overhead", "time"),
    "native alpha": ("native: {allreduce: {alpha: VALUE, bandwidth: 2 GB/s}}",
                     "native.allreduce.alpha", "time"),
    "native alpha_per_rank": ("native: {allgather: {alpha: 1 us, alpha_per_rank: VALUE, "
                              "bandwidth: 2 GB/s}}", "native.allgather.alpha_per_rank", "time"),
    "reduce_bandwidth": ("reduce_bandwidth: VALUE", "reduce_bandwidth", "bandwidth"),
    "host.bandwidth": ("host: {bandwidth: VALUE, cores: 2, ranks: 8}", "host.bandwidth",
                       "bandwidth"),
    "native bandwidth": ("native: {reduce: {alpha: 1 us, bandwidth: VALUE}}",
                         "native.reduce.bandwidth", "bandwidth"),
    "max_bytes": ("small_messages: {max_bytes: VALUE, alpha: 1 us}",
                  "small_messages.max_bytes", "bytes"),
    "host.cores": ("host: {bandwidth: 1 GB/s, cores: VALUE}", "host.cores", "cores"),
    "host.ranks": ("host: {bandwidth: 1 GB/s, ranks: VALUE}", "host.ranks", "ranks"),
}

# (inside, outside the plausible range, beyond the limits, NaN or infinite, negative) per kind
VALUES = {
    "time": ("12 us", "200 ms", "2e6 s", ".nan", "-1 us"),
    "bandwidth": ("10 GB/s", "50 Kbit/s", "1e308 GB/s", ".inf", "-5 GB/s"),
    "bytes": ("64KiB", "4GiB", "2305843009213693952", None, "-1"),
    "cores": ("16", "9000", "2000000", None, "-3"),
    "ranks": ("8", "2048", "5000", None, "0"),
}
RANGE_TEXT = {"time": "0 to 1e6 s (11.6 days)", "bandwidth": "1 bit/s to 1000 TB/s",
              "bytes": "2**60 bytes", "cores": "1 to 1048576", "ranks": "1 to 4096"}


def profile(field: str, value: str) -> str:
    line = FIELDS[field][0].replace("VALUE", value)
    return f"name: p\n{line}\n"


def read(text: str) -> tuple[CostProfile, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TopoplanWarning)
        loaded = loads_profile(text, "p.yaml")
    return loaded, [str(w.message) for w in caught if isinstance(w.message, RangeWarning)]


def error(text: str) -> str:
    with pytest.raises(ProfileError) as info:
        loads_profile(text, "p.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_plausible_value_reads_silently(field):
    kind = FIELDS[field][2]
    _, caught = read(profile(field, VALUES[kind][0]))
    assert caught == []


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_an_implausible_value_is_a_located_range_warning(field):
    _, key, kind = FIELDS[field]
    value = VALUES[kind][1]
    _, caught = read(profile(field, value))
    plausible = PROFILE_RANGES[kind].plausible_text
    assert caught == [f"p.yaml:2: {key}: {value} is outside the plausible range "
                      f"{plausible}; {PROFILE_RANGES[kind].hint}"]


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_value_beyond_the_limits_is_a_located_error_with_the_range(field):
    _, key, kind = FIELDS[field]
    value = VALUES[kind][2]
    message = error(profile(field, value))
    if kind == "bytes":  # a size beyond 2**60 is no size (topoplan.units.parse_size)
        assert message.startswith(f"p.yaml:2: {key}: a size must be at most 2**60 bytes")
        return
    assert message.startswith(f"p.yaml:2: {key}: {value} is out of range: "), message
    assert RANGE_TEXT[kind] in message and "(plausible: " in message, message


@pytest.mark.parametrize("field", sorted(f for f in FIELDS
                                         if VALUES[FIELDS[f][2]][3] is not None))
def test_nan_and_infinity_are_located_errors_with_the_range(field):
    _, key, kind = FIELDS[field]
    message = error(profile(field, VALUES[kind][3]))
    assert message.startswith(f"p.yaml:2: {key}: "), message
    assert "finite" in message and RANGE_TEXT[kind] in message, message


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_negative_value_is_a_located_error(field):
    _, key, kind = FIELDS[field]
    message = error(profile(field, VALUES[kind][4]))
    assert message.startswith(f"p.yaml:2: {key}: "), message


def test_a_bare_number_is_shown_with_the_unit_it_was_read_in():
    with pytest.warns(RangeWarning, match=r"p.yaml:2: op_overhead: 200000 us is outside "
                                          r"the plausible range 0 to 100 ms"):
        loads_profile("name: p\nop_overhead: 200000\n", "p.yaml")
    assert error("name: p\nreduce_bandwidth: 1e308\n").startswith(
        "p.yaml:2: reduce_bandwidth: 1e308 GB/s is out of range")


@pytest.mark.parametrize("name", profile_names())
def test_the_shipped_profiles_are_inside_the_plausible_ranges(name):
    from topoplan.analysis.cost.read import _PROFILE_DIR
    _, caught = read((_PROFILE_DIR / f"{name}.yaml").read_text())
    assert caught == []


def test_a_profile_written_by_topoplan_reads_back_without_a_warning():
    saved = get_profile("mpi").with_costs(name="m", native_costs=(
        ("allreduce", NativeCost(alpha=30e-6, bandwidth=2e9, alpha_per_rank=4e-6)),))
    again, caught = read(saved.dumps())
    assert caught == [] and again.op_overhead == saved.op_overhead
    native = again.native_cost("allreduce")
    assert native is not None and native.alpha == pytest.approx(30e-6)


# ---- profiles built in code: held to the same limits -----------------------------------
@pytest.mark.parametrize("changes, key", [
    ({"op_overhead": 2e6}, "op_overhead"),
    ({"alpha_network": math.inf}, "alpha_network"),
    ({"reduce_bandwidth": math.inf}, "reduce_bandwidth"),
    ({"reduce_bandwidth": math.nan}, "reduce_bandwidth"),
    ({"reduce_bandwidth": 1e-3}, "reduce_bandwidth"),
    ({"host_bandwidth": 1e16}, "host_bandwidth"),
    ({"small_max": 1 << 61}, "small_max"),
    ({"host_cores": 0}, "host_cores"),
    ({"host_ranks": 5000}, "host_ranks"),
    ({"native_costs": (("allreduce", NativeCost(alpha=1e-6, bandwidth=1e16)),)},
     "native.allreduce.bandwidth"),
    ({"native_costs": (("allreduce", NativeCost(alpha=1e7, bandwidth=1e9)),)},
     "native.allreduce.alpha"),
])
def test_a_profile_built_in_code_beyond_the_limits_is_refused(changes, key):
    with pytest.raises(ProfileError) as info:
        CostProfile(name="coded", **changes)
    assert str(info.value).startswith(f"coded: {key}: "), str(info.value)


def test_the_bandwidths_share_the_cluster_files_range():
    from topoplan.cluster.spec import BANDWIDTH_LIMITS, BANDWIDTH_PLAUSIBLE
    assert PROFILE_RANGES["bandwidth"] is BANDWIDTH_RANGE
    assert BANDWIDTH_RANGE.limits == BANDWIDTH_LIMITS
    assert BANDWIDTH_RANGE.plausible == BANDWIDTH_PLAUSIBLE


def test_plan_and_simulate_refuse_a_bad_profile_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nop_overhead: 1e7 s\n")
    cluster = "topologies/ddl_two_switch.yaml"
    assert main(["plan", cluster, "--size", "1MiB", "-a", "ring", "--profile", str(bad)]) != 0
    err = capsys.readouterr().err
    assert err == (f"topoplan: error: {bad}:2: op_overhead: 1e7 s is out of range: a time "
                   "must be 0 to 1e6 s (11.6 days), what topoplan computes with (plausible: "
                   "0 to 100 ms)\n")
    odd = tmp_path / "odd.yaml"
    odd.write_text("name: odd\nop_overhead: 200 ms\n")
    plan = tmp_path / "ring.json"
    assert main(["plan", cluster, "--size", "1MiB", "-a", "ring", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["simulate", cluster, str(plan), "--sizes", "1MiB", "--profile",
                 str(odd)]) == 0
    err = capsys.readouterr().err
    assert (f"topoplan: warning: {odd}:2: op_overhead: 200 ms is outside the plausible "
            "range 0 to 100 ms; check the unit") in err
