"""``topoplan.simulate``: the simulator's public names (it lives in :mod:`topoplan.sim`).

``from topoplan.simulate import simulate, SimReport`` keeps working; importing this
module is cheap (the engine loads on the first call).
"""

from __future__ import annotations

from .sim import SimReport, TransferRecord, simulate

__all__ = ["simulate", "SimReport", "TransferRecord"]
