"""Other tools' formats: NCCL topology files in, MSCCL XML algorithms out and in.

- :mod:`topoplan.interop.xmlfile`: a small XML reader that keeps line numbers, so every
  error names file, line and element;
- :mod:`topoplan.interop.nccl_topo`: an NCCL topology file (``NCCL_TOPO_FILE``) to a
  cluster YAML file (``topoplan topo import nccl``);
- :mod:`topoplan.interop.msccl`: the MSCCL XML format, a package of one concept per module
  (model, parser, writer, the executor's limits, a symbolic checker), and a schedule to
  MSCCL XML (:mod:`~topoplan.interop.msccl.export`, ``topoplan export --format msccl``)
  and back (:mod:`~topoplan.interop.msccl.import_`, ``topoplan import msccl``).
"""
