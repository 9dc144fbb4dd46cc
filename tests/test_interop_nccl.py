"""``topoplan topo import nccl``: NCCL topology files to cluster YAML files that load and plan.

The H100 file is a real one (IBM Cloud's HGX H100 server, tests/data/README.md): the
import must find the NVSwitch fabric NCCL would (18 NVLinks x SM90_NVLINK_BW) and pair
each NIC with the GPU on its PCIe bridge, checked here against the bus ids in the file.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from topoplan.cli import main
from topoplan.cluster import load_cluster, loads_cluster
from topoplan.errors import ClusterSpecError, TopoplanError, UnitWarning, XmlFormatError
from topoplan.interop.nccl_topo import (import_nccl_topology, inter_cpu_bandwidth,
                                        nvlink_bandwidth, pci_bandwidth, render_cluster_yaml)
from topoplan.interop.xmlfile import parse_xml

DATA = Path(__file__).resolve().parent / "data"
H100 = DATA / "nccl_topo_hgx_h100.xml"
NDV4 = DATA / "ndv4_topo_partial.xml"
PCIE = DATA / "nccl_topo_pcie_2cpu.xml"


def h100_pairs() -> dict[str, str]:
    """GPU bus id -> bus id of the NIC under the same PCIe bridge, read from the file."""
    root = parse_xml(H100.read_bytes(), str(H100))
    pairs = {}
    for bridge in root.iter("pci"):
        kids = bridge.find_all("pci")
        gpus = [p.get("busid") for p in kids if p.find_all("gpu")]
        nics = [p.get("busid") for p in kids if p.find_all("nic")]
        if gpus and nics:
            assert len(gpus) == len(nics) == 1
            pairs[gpus[0]] = nics[0]
    return pairs


def test_constants_follow_nccl():
    assert nvlink_bandwidth(90) == pytest.approx(20.6e9)
    assert nvlink_bandwidth(80) == nvlink_bandwidth(70) == pytest.approx(20e9)
    assert nvlink_bandwidth(86) == pytest.approx(12e9)
    assert nvlink_bandwidth(100) == pytest.approx(40.1e9)
    assert nvlink_bandwidth(60) == pytest.approx(18e9)
    assert pci_bandwidth("32.0 GT/s PCIe", 16) == (pytest.approx(48e9), True)
    assert pci_bandwidth("16 GT/s", 16) == (pytest.approx(24e9), True)
    assert pci_bandwidth("32.0 GT/s PCIe", 0) == (pytest.approx(48e9), True)  # 0 lanes -> 16
    assert pci_bandwidth("Unknown", 16) == (pytest.approx(12e9), False)       # 8 GT/s
    cpu = parse_xml('<cpu arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143"/>')
    assert inter_cpu_bandwidth(cpu) == (pytest.approx(22e9), "SRP_QPI_BW")
    amd = parse_xml('<cpu arch="x86_64" vendor="AuthenticAMD" familyid="23" modelid="49"/>')
    assert inter_cpu_bandwidth(amd) == (pytest.approx(16e9), "AMD_BW")


def test_h100_imports_to_an_nvswitch_box_with_rail_nics():
    imported = import_nccl_topology(H100)
    box = imported.document["boxes"][0]
    assert box["gpus"] == 8 and imported.nranks == 8
    cluster = loads_cluster(render_cluster_yaml(imported))
    (node,) = cluster.boxes
    assert node.fabric is not None
    assert node.fabric.bandwidth == pytest.approx(18 * 20.6e9)  # 370.8 GB/s
    assert not node.gpu_links
    assert len(node.nics) == 8
    assert all(nic.bandwidth == pytest.approx(25e9) for nic in node.nics)  # 200000 Mbps

    # GPU j is <gpu dev="j">; NIC k serves exactly the GPU on its PCIe bridge.
    gpu_busids = [re.search(r"PCI (\S+) \(dev (\d)\)", item).group(1)
                  for item in imported.comments["gpus"].split("; ")]
    nic_busids = [re.search(r"PCI (\S+),", imported.comments[f"nics[{k}]"]).group(1)
                  for k in range(8)]
    pairs = h100_pairs()
    assert len(pairs) == 8
    for k, nic in enumerate(node.nics):
        assert len(nic.gpus) == 1
        assert pairs[gpu_busids[nic.gpus[0]]] == nic_busids[k]
    # Spot check against the file: dev 0 is on 0000:a4:00.0, beside mlx5_7 on a3.
    assert gpu_busids[0] == "0000:a4:00.0"
    first = next(k for k, nic in enumerate(node.nics) if nic.gpus == (0,))
    assert imported.comments[f"nics[{first}]"].startswith("mlx5_7, PCI 0000:a3:00.0")
    assert any("non-blocking" in note for note in imported.assumptions)
    # sm 90 on an NVSwitch: the GPU model, and the switch that reduces (NVLS).
    assert node.gpu == "H100"
    assert node.fabric.kind == "nvswitch" and node.fabric.nvls
    assert any(note.startswith("NVLS:") for note in imported.assumptions)


def test_gpu_model_and_fabric_kind_from_older_boxes(tmp_path):
    pcie = loads_cluster(render_cluster_yaml(import_nccl_topology(PCIE)))
    assert pcie.boxes[0].fabric.kind == "pcie" and not pcie.boxes[0].fabric.nvls
    h100 = import_nccl_topology(H100, nvlink_per_gpu=240e9)
    ampere_like = H100.read_text().replace('sm="90"', 'sm="80"')
    path = tmp_path / "sm80.xml"
    path.write_text(ampere_like)
    a100 = loads_cluster(render_cluster_yaml(import_nccl_topology(path)))
    box = a100.boxes[0]
    assert box.gpu == "A100" and box.fabric.kind == "nvswitch" and not box.fabric.nvls
    assert h100.document["boxes"][0]["fabric"]["nvls"] is True


def test_written_file_loads_and_plans(tmp_path, capsys):
    out = tmp_path / "h100.yaml"
    assert main(["topo", "import", "nccl", str(H100), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "topoplan: note: latency" in err
    text = out.read_text()
    assert text.startswith("# Cluster YAML v1")
    assert "# Assumptions and simplifications:" in text
    assert "SM90_NVLINK_BW" in text
    assert load_cluster(out).nranks == 8
    assert main(["plan", str(out), "--size", "64MiB", "--candidates", "ring,rhd",
                 "--json"]) == 0
    assert '"algorithm"' in capsys.readouterr().out


def test_two_nodes_give_sixteen_ranks_on_rails(tmp_path, capsys):
    out = tmp_path / "h100x2.yaml"
    assert main(["topo", "import", "nccl", str(H100), "--nodes", "2", "-o", str(out)]) == 0
    cluster = load_cluster(out)
    assert cluster.nranks == 16 and len(cluster.boxes) == 2
    assert sorted(cluster.switches) == sorted([f"rail{k}" for k in range(8)] + ["spine"])
    # Each rail carries 2 NICs of 25 GB/s up to the spine: non-blocking.
    assert [link.bandwidth for link in cluster.links] == [pytest.approx(50e9)] * 8
    # GPU 3 of node0 and GPU 3 of node1 meet on one rail, without the spine.
    routes = cluster.routes(3, 11)
    assert routes and all("spine" not in path for path in routes)
    assert main(["plan", str(out), "--size", "16MiB", "--candidates", "ring",
                 "--json"]) == 0
    capsys.readouterr()


def test_single_switch_network_and_stdout(capsys):
    assert main(["topo", "import", "nccl", str(H100), "--nodes", "3",
                 "--network", "single"]) == 0
    captured = capsys.readouterr()
    cluster = loads_cluster(captured.out)
    assert cluster.nranks == 24 and list(cluster.switches) == ["spine"]
    assert not cluster.links
    assert "--network single" in captured.err


def test_network_none_one_node_has_no_nics(capsys):
    imported = import_nccl_topology(H100, network="none")
    assert "nics" not in imported.document["boxes"][0]
    assert "switches" not in imported.document
    with pytest.raises(TopoplanError, match="--network none"):
        import_nccl_topology(H100, network="none", nodes=2)


def test_overlay_gives_the_network(tmp_path):
    overlay = tmp_path / "net.yaml"
    overlay.write_text("switches:\n  - {name: \"leaf{i}\", count: 2}\n  - core\n"
                       "links:\n  - {a: \"leaf{i}\", b: core, count: 2, bandwidth: 400 GB/s}\n"
                       "nic_switches: \"leaf{i//2}\"\n")
    imported = import_nccl_topology(H100, nodes=4, overlay=overlay)
    cluster = loads_cluster(render_cluster_yaml(imported))
    assert cluster.nranks == 32
    assert {nic.switch for nic in cluster.boxes[3].nics} == {"leaf1"}
    assert any("overlay" in note for note in imported.assumptions)

    overlay.write_text("switches: [spine]\nnic_switches: [spine, spine]\n")
    with pytest.raises(ClusterSpecError, match=r"net.yaml:2: nic_switches: expected 8 switch"):
        import_nccl_topology(H100, overlay=overlay)
    overlay.write_text("switches: [spine]\nnic_switch: spine\n")
    with pytest.raises(ClusterSpecError, match=r"net.yaml:2: nic_switch: unknown key"):
        import_nccl_topology(H100, overlay=overlay)
    overlay.write_text("switches: [spine]\nnic_switches: leaf\n")
    with pytest.raises(ClusterSpecError, match=r"net.yaml: the cluster built with the overlay"
                                               r".*unknown switch 'leaf'"):
        import_nccl_topology(H100, overlay=overlay)


def test_overlay_bare_numbers_are_named_in_the_overlay_and_written_with_units(tmp_path):
    overlay = tmp_path / "net.yaml"
    overlay.write_text("switches: [leaf, core]\n"
                       "links:\n  - {a: leaf, b: core, bandwidth: 400, latency: 1}\n"
                       "nic_switches: leaf\n")
    with pytest.warns(UnitWarning) as caught:
        imported = import_nccl_topology(H100, overlay=overlay)
    assert [str(w.message) for w in caught] == [
        f"{overlay}:3: links[0].bandwidth: bare number 400 read as 400 GB/s (3200 Gbit/s); "
        "write '400 GB/s' or '400 Gbit/s'",
        f"{overlay}:3: links[0].latency: bare number 1 read as 1 us; write '1 us' "
        "(or '1 ns', '1 ms' if that is what you meant)"]
    text = render_cluster_yaml(imported)
    assert "bandwidth: 400 GB/s" in text and "latency: 1 us" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnitWarning)  # the file written says its units
        assert loads_cluster(text).links[0].bandwidth == 400e9


def test_partial_file_needs_flags_and_names_them(tmp_path, capsys):
    out = tmp_path / "ndv4.yaml"
    assert main(["topo", "import", "nccl", str(NDV4), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    # The first GPU of the file, as file:line: element: what to pass.
    assert re.search(r"ndv4_topo_partial.xml:12: system/cpu\[0\]/pci\[0\]/pci\[0\]: a GPU "
                     r"without a <gpu> child.*--nvlink-per-gpu", err)
    assert not out.exists()
    assert main(["topo", "import", "nccl", str(NDV4), "--nvlink-per-gpu", "240GB/s",
                 "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert re.search(r"ndv4_topo_partial.xml:13: system/cpu\[0\]/pci\[0\]/pci\[1\]: a NIC "
                     r"without a <nic>/<net> child.*--nic-speed", err)
    assert not out.exists()

    assert main(["topo", "import", "nccl", str(NDV4), "--nvlink-per-gpu", "240GB/s",
                 "--nic-speed", "200Gbit/s", "--nodes", "2", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "topoplan: note: NVLink: every GPU on an NVSwitch fabric of 240 GB/s" in err
    assert "capped to 24 GB/s" in err  # PCIe Gen4 x16 below 200 Gbit/s, as NCCL computes
    cluster = load_cluster(out)
    assert cluster.nranks == 16
    box = cluster.boxes[0]
    assert box.fabric.bandwidth == pytest.approx(240e9)
    # Two GPUs and two NICs share each PCIe switch: each NIC serves both GPUs.
    # GPU order is by bus id: 0001, 0002 (cpu 1), 0003, 0004 (cpu 0), 000b, 000c, 000d, 000e.
    assert [nic.gpus for nic in box.nics] == [(2, 3), (2, 3), (0, 1), (0, 1),
                                              (6, 7), (6, 7), (4, 5), (4, 5)]
    # The header comment is wrapped at 92 columns, wherever the file's path puts the break.
    header = " ".join(line[2:] for line in out.read_text().splitlines() if line.startswith("# "))
    assert "--nvlink-per-gpu 240GB/s" in header


def test_pcie_only_box_uses_the_pcie_bottleneck():
    imported = import_nccl_topology(PCIE)
    cluster = loads_cluster(render_cluster_yaml(imported))
    box = cluster.boxes[0]
    # Gen3 x16 = 12 GB/s inside a socket; SKL_QPI_BW = 10 GB/s between the two.
    assert box.fabric.bandwidth == pytest.approx(10e9)
    assert [nic.gpus for nic in box.nics] == [(0, 1), (2, 3)]
    assert all(nic.bandwidth == pytest.approx(12e9) for nic in box.nics)
    assert any("SKL_QPI_BW" in note and "not modelled" in note
               for note in imported.assumptions)


NVLINK_PAIRS = """<system version="1">
  <cpu host_hash="0x1" numaid="0" arch="x86_64" vendor="AuthenticAMD" familyid="23" modelid="49">
    <pci busid="0000:01:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="80" rank="0" gdr="1">
          <nvlink target="0000:03:00.0" count="4" tclass="0x030200"/>
        </gpu>
      </pci>
      <pci busid="0000:03:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="1" sm="80" rank="1" gdr="1">
          <nvlink target="0000:02:00.0" count="4" tclass="0x030200"/>
        </gpu>
      </pci>
    </pci>
  </cpu>
  <cpu host_hash="0x1" numaid="1" arch="x86_64" vendor="AuthenticAMD" familyid="23" modelid="49">
    <pci busid="0000:81:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="8">
      <gpu dev="2" sm="80" rank="2" gdr="1"/>
    </pci>
  </cpu>
</system>
"""


def test_direct_nvlinks_become_gpu_links_and_pcie_joins_the_rest(tmp_path):
    path = tmp_path / "pairs.xml"
    path.write_text(NVLINK_PAIRS)
    imported = import_nccl_topology(path)
    box = loads_cluster(render_cluster_yaml(imported)).boxes[0]
    (link,) = box.gpu_links
    assert (link.a, link.b) == (0, 1)
    assert link.bandwidth == pytest.approx(4 * 20e9)  # 4 x SM80_NVLINK_BW, listed once
    # GPU 2 is on the other socket behind a x8 Gen4 link: 12 GB/s, below AMD_BW = 16 GB/s.
    assert box.fabric.bandwidth == pytest.approx(12e9)
    assert not any(note.startswith("ignored") for note in imported.assumptions)

    path.write_text(NVLINK_PAIRS.replace('<gpu dev="2" sm="80" rank="2" gdr="1"/>',
                                         '<gpu dev="2" sm="90" rank="2" gdr="1">'
                                         '<c2c bw="400" count="2"/></gpu>'))
    notes = import_nccl_topology(path).assumptions
    assert "ignored 1 <c2c> element: GPU-CPU C2C links (a cluster file has no CPU)" in notes


def bad(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.xml"
    path.write_text(text)
    with pytest.raises(XmlFormatError) as info:
        import_nccl_topology(path)
    return str(info.value)


def test_errors_name_file_line_and_element(tmp_path):
    text = H100.read_text().replace('sm="90" rank="3"', 'sm="nine" rank="3"')
    line = next(i for i, row in enumerate(text.splitlines(), 1) if 'sm="nine"' in row)
    message = bad(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'bad.xml'}:{line}: system/cpu[0]/pci[3]/pci[1]/"
                              "gpu[0]: sm: must be an integer, got 'nine'")

    message = bad(tmp_path, '<system version="1">\n</system>\n')
    assert message.endswith("bad.xml:1: system: no <cpu> element: NCCL's topology puts "
                            "every device under a <cpu> (NUMA node)")
    message = bad(tmp_path, '<system version="1">\n  <cpu numaid="0">\n'
                            '    <pci busid="0000:01:00.0" class="0x030200"/>\n  </cpu>\n'
                            '</system>\n')
    assert ":3: system/cpu[0]/pci[0]: a GPU without a <gpu> child" in message
    message = bad(tmp_path, text.replace('tclass="0x068000"', "", 1))
    assert re.search(r":\d+: system/cpu\[0\]/pci\[0\]/pci\[1\]/gpu\[0\]/nvlink\[0\]: "
                     r"tclass: missing attribute", message)
    assert "bad.xml:3: not well-formed XML: mismatched tag" in bad(
        tmp_path, '<system version="1">\n<cpu>\n</system>\n')
    assert "bad.xml:1: system: no GPU" in bad(tmp_path, '<system version="1">\n<cpu/>\n</system>')
    assert "root element is <topology>" in bad(tmp_path, "<topology/>")
    assert "version 2 is not supported" in bad(tmp_path, '<system version="2"><cpu/></system>')
    assert "not well-formed XML" in bad(tmp_path, "this is not XML")


def test_no_file_is_written_on_error(tmp_path, capsys):
    out = tmp_path / "out.yaml"
    out.write_text("old\n")
    broken = tmp_path / "broken.xml"
    broken.write_text(H100.read_text().replace('count="5"', 'count="-5"', 1))
    assert main(["topo", "import", "nccl", str(broken), "-o", str(out)]) == 1
    assert "count: must be >= 0, got -5" in capsys.readouterr().err
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.xml", "out.yaml"]


def test_cli_rejects_bad_options(capsys):
    with pytest.raises(SystemExit):
        main(["topo", "import", "smi", str(H100)])
    with pytest.raises(SystemExit):
        main(["topo", "import", "nccl", str(H100), "--nic-speed", "fast"])
    capsys.readouterr()
    assert main(["topo", "import", "nccl", str(H100), "--network", "rail",
                 "--overlay", "x.yaml"]) == 1
    assert "leave out --network" in capsys.readouterr().err
    assert main(["topo", "import", "nccl", str(DATA / "missing.xml")]) == 1
    assert "missing.xml" in capsys.readouterr().err


def test_ports_of_one_card_are_one_nic(tmp_path):
    # NCCL reads a card's ports as one PCI device (src/transport/net_ib/init.cc:69-70 sets
    # the function to 0) and merges them into one (NCCL_IB_MERGE_NICS=1, :198): the import
    # writes one NIC of their summed speed, not two that `topo lint` would flag.
    card = ('<pci busid="0000:04:00.0" class="0x020000" link_speed="16.0 GT/s PCIe" '
            'link_width="16"><nic>'
            '<net name="mlx5_0" dev="0" speed="50000" port="1" guid="0x1" maxconn="131072" '
            'gdr="1"/>'
            '<net name="mlx5_1" dev="1" speed="50000" port="2" guid="0x1" maxconn="131072" '
            'gdr="1"/></nic></pci>\n    </pci>\n  </cpu>\n  <cpu host_hash="0x1" numaid="1"')
    path = tmp_path / "ports.xml"
    path.write_text(NVLINK_PAIRS.replace('</pci>\n  </cpu>\n  <cpu host_hash="0x1" numaid="1"',
                                         card, 1))
    imported = import_nccl_topology(path)
    box = loads_cluster(render_cluster_yaml(imported)).boxes[0]
    (nic,) = box.nics
    assert nic.bandwidth == pytest.approx(2 * 50000 / 8000 * 1e9)
    assert any("2 ports of one card (mlx5_0, mlx5_1) merged" in note
               for note in imported.assumptions)


def test_the_plugins_reported_latency_becomes_plugin_latency(tmp_path):
    # NCCL writes ncclNetProperties_t.latency as <net latency> (ncclTopoPopulateNics) and
    # reads it back as the NET node's latency (ncclTopoAddNet): aws-ofi-nccl reports 75 us
    # on p5. The import writes it as the NIC's plugin_latency; NCCL's own IB reports 0,
    # which writes no key (the H100 dump has latency="0.000000").
    card = ('<pci busid="0000:04:00.0" class="0x020000" link_speed="16.0 GT/s PCIe" '
            'link_width="16"><nic>'
            '<net name="rdmap0" dev="0" speed="400000" port="1" latency="75" guid="0x1" '
            'maxconn="131072" gdr="1"/></nic></pci>\n    </pci>\n  </cpu>\n'
            '  <cpu host_hash="0x1" numaid="1"')
    path = tmp_path / "efa.xml"
    path.write_text(NVLINK_PAIRS.replace('</pci>\n  </cpu>\n  <cpu host_hash="0x1" numaid="1"',
                                         card, 1))
    imported = import_nccl_topology(path, nodes=2)
    text = render_cluster_yaml(imported)
    assert "plugin_latency: 75 us" in text
    (nic,) = loads_cluster(text).boxes[0].nics
    assert nic.plugin_latency == pytest.approx(75e-6)
    assert any("plugin_latency 75 us" in note for note in imported.assumptions)
    ib = loads_cluster(render_cluster_yaml(import_nccl_topology(H100, nodes=2)))
    assert all(nic.plugin_latency == 0.0 for nic in ib.boxes[0].nics)
    assert "plugin_latency" not in render_cluster_yaml(import_nccl_topology(H100))
    path.write_text(path.read_text().replace('latency="75"', 'latency="fast"'))
    with pytest.raises(XmlFormatError, match="latency: must be a number, got 'fast'"):
        import_nccl_topology(path)
