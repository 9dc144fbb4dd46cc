"""Deprecated: moved to :mod:`topoplan.interop.msccl.import_`; this path is that module."""

from .._deprecation import moved_module

moved_module(__name__, "topoplan.interop.msccl.import_")
