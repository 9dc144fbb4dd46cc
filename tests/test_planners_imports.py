"""The planners' parts import one way: no cycle through the mcf package or the shared
modules (``planners/_*.py``)."""

from __future__ import annotations

import networkx as nx

from tests.support.scripts import load_script


def _import_graph():
    return load_script("import_graph")


def test_no_import_cycle_runs_through_the_mcf_package_or_the_shared_modules():
    """Imports in function bodies count (a cycle hidden there is still one to follow);
    those under ``if TYPE_CHECKING:`` do not."""
    graph = _import_graph().module_graph(typing=False)

    def ours(module: str) -> bool:
        return (module.startswith("topoplan.planners.mcf")
                or module.startswith("topoplan.planners._"))

    cycles = [sorted(c) for c in nx.strongly_connected_components(graph)
              if len(c) > 1 and any(ours(m) for m in c)]
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)

