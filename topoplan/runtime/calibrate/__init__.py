"""Measure a transport's costs on this machine and fit a :class:`~topoplan.analysis.cost.CostProfile`.

:func:`calibrate` runs micro-benchmarks on any :class:`~topoplan.runtime.transports.Transport`,
collectively on all ranks, and fits the profile of this machine through the simulator.
One module per concept:

- :mod:`.cases`: the micro-benchmarks (:class:`Case`, :func:`calibration_cases`):
  ping-pongs, executor runs built to separate the costs, and the adds alone;
- :mod:`.measuring`: timing them on a transport (:func:`measure`, one :class:`Sample`
  per case);
- :mod:`.fitting`: least squares through the simulator (:func:`fit_costs`, :class:`Fit`);
- :mod:`.native`: the transport's own collectives over groups of ranks, measured and
  fitted into the profile's ``native`` section (:func:`native_cases`,
  :func:`measure_native`, :func:`fit_native`);
- :mod:`.probe`: what the host and the transport say of themselves
  (:func:`transport_info`, :func:`small_limit`, :func:`host_cores`, :func:`load_average`);
- :mod:`.profile`: the profile of this machine (:func:`fit_profile`, and
  :func:`calibrate`, the whole run);
- :mod:`.cache`: calibration on the job, cached (:func:`job_profile`: the profile a
  running job is priced with, looked up by its :class:`CacheKey`, measured when asked
  and kept in :func:`cache_root`).

The modules are not named after their functions (``measure``, ``fit_costs``): a submodule
and a function of the same name in a package make ``import topoplan.runtime.calibrate.x``
and ``topoplan.runtime.calibrate.x`` mean different things.

Three modules are named calibrate:

- this package, the library: measuring and fitting on the ranks of one host;
- :mod:`topoplan.commands.calibrate`, the ``topoplan calibrate`` command: it launches
  this package's :func:`measure` under ``mpiexec``, fits with :func:`fit_profile` and
  writes the profile YAML file;
- :mod:`topoplan.testbed.calibrate`: the emulated testbed's calibration (``alpha`` and
  ``reduce_bandwidth`` from runs inside its network namespaces), fitted with this
  package's :func:`fit_costs`.

Benchmarking a schedule (not a transport's costs) is :mod:`topoplan.runtime.bench`, and
``topoplan bench`` (:mod:`topoplan.commands.bench`).
"""

from __future__ import annotations

# Every name the single module had stays importable from here (the case builders too:
# topoplan.testbed.calibrate builds its runs with direct_schedule).
from ..._compat import moved_names
from ..bench import array_kind
from .cases import (BIG, MEDIUM_CHUNK, PING_BYTES, PING_MESSAGES, TINY_CHUNK, Case, _chain,
                    _rings, calibration_cases, direct_schedule)
from .fitting import PARAMETERS, Fit, FittedSample, fit_costs
from .measuring import Sample, measure
from .native import NATIVE_RULE, fit_native, measure_native, native_cases
from .probe import host_cores, load_average, small_limit, transport_info
from .profile import (FULL, HOST_PARAMETERS, QUICK, SPLIT_RULE, Measured, calibrate,
                      fit_measured, fit_profile, measure_all)
from .cache import (ENV_CALIBRATE, TESTBED_SCALE_ENV, Pricing, job_pricing, CacheEntry, CacheKey, cache_root, cached_profiles,
                    calibration_mode, host_set, job_key, job_profile, launcher_profile, lookup,
                    runtime_of_profile,
                    runtime_of_transport, shipped_profile_for, store, transport_family)

__all__ = ["launcher_profile", "Pricing", "job_pricing", "TESTBED_SCALE_ENV", "Case", "Sample", "FittedSample", "Fit", "PARAMETERS", "HOST_PARAMETERS",
           "calibration_cases", "measure", "fit_costs", "fit_profile", "calibrate", "SPLIT_RULE",
           "native_cases", "measure_native", "fit_native", "NATIVE_RULE",
           "host_cores", "small_limit",
           "array_kind", "transport_info", "load_average",
           "Measured", "measure_all", "fit_measured",
           "ENV_CALIBRATE", "cache_root", "transport_family", "shipped_profile_for",
           "runtime_of_transport", "runtime_of_profile", "calibration_mode", "host_set",
           "CacheKey", "job_key", "lookup", "store", "CacheEntry", "cached_profiles",
           "job_profile"]

#: ``fit`` was renamed: it clashed with the class :class:`Fit` but for case.
__getattr__ = moved_names(__name__, {"fit": "topoplan.runtime.calibrate.fitting:fit_costs"})
