"""Passes over schedules: each takes a :class:`~topoplan.ir.schedule.Schedule` and returns
a new one that computes the same thing (nothing rewrites a schedule in place).

- :func:`coalesce` (:mod:`.coalesce`): a pair's back-to-back messages over consecutive
  chunks as one range (IR v2);
- :func:`vectorize` and :func:`split_vectored` (:mod:`.vectorize`): a step's messages to
  one peer as one message of several ranges, and back (IR v4);
- :func:`lower_native` (:mod:`.lower`): native steps (IR v3) as point-to-point steps;
- :func:`channelize` (:mod:`.channels`): the schedule on ``C`` independent channels over
  disjoint slices of the data (IR v4).
"""

from __future__ import annotations

from .channels import MAX_CHANNELS, channelize, check_channels, check_skew, slices
from .coalesce import coalesce
from .lower import lower_call, lower_native
from .vectorize import split_vectored, vectorize

__all__ = ["coalesce", "vectorize", "split_vectored", "lower_native", "lower_call", "channelize",
           "check_channels", "check_skew", "slices", "MAX_CHANNELS"]
