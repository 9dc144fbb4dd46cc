import subprocess
import sys


def test_cli_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "topoplan", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "topo" in out


def test_public_api_names_are_the_functions_even_after_submodule_imports():
    code = ("import topoplan.ir.verify, topoplan.simulate, topoplan.planners, topoplan.analysis.bound\n"
            "import topoplan\n"
            "from topoplan import verify, simulate, plan, lower_bound, load_cluster\n"
            "assert all(callable(f) for f in (verify, simulate, plan, lower_bound, load_cluster))\n"
            "assert callable(topoplan.verify) and callable(topoplan.simulate)\n"
            "import sys; assert 'torch' not in sys.modules and 'mpi4py' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_topoplan_loads_no_heavy_dependency():
    """``import topoplan`` stays cheap: the numeric, graph and YAML libraries and the
    optional dependencies load only when a name that needs them is used."""
    heavy = ["numpy", "scipy", "networkx", "yaml", "torch", "matplotlib", "highspy", "mpi4py",
             "cupy", "rich"]
    code = ("import sys, topoplan\n"
            f"loaded = [m for m in {heavy!r} if m in sys.modules]\n"
            "assert not loaded, loaded\n"
            "names = [n for n in topoplan.__all__ if n not in vars(topoplan)]\n"
            "for name in names:\n"
            "    getattr(topoplan, name)  # every public name resolves\n"
            "assert 'networkx' in sys.modules  # ... and loads what it needs then\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_submodule_is_an_attribute_of_the_package():
    code = ("import topoplan\n"
            "for name in ('analysis', 'cluster', 'estimate', 'interop', 'ir', 'planners',\n"
            "             'runtime', 'testbed', 'torch', 'units', 'viz'):\n"
            "    assert getattr(topoplan, name).__name__ == 'topoplan.' + name\n"
            "for old, new in topoplan.MOVED.items():  # the old paths at the root\n"
            "    if old.count('.') == 1 and old not in ('topoplan.verify', 'topoplan.simulate'):\n"
            "        assert getattr(topoplan, old.split('.')[1]).__name__ == new, old\n"
            "assert callable(topoplan.simulate) and callable(topoplan.verify)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
