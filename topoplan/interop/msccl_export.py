"""Deprecated: moved to :mod:`topoplan.interop.msccl.export`; this path is that module."""

from .._deprecation import moved_module

moved_module(__name__, "topoplan.interop.msccl.export")
