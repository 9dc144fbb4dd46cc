import subprocess
import sys


def test_cli_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "topoplan", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "topo" in out


def test_public_api_names_are_the_functions_even_after_submodule_imports():
    code = ("import topoplan.verify, topoplan.simulate, topoplan.planners, topoplan.bound\n"
            "import topoplan\n"
            "from topoplan import verify, simulate, plan, lower_bound, load_cluster\n"
            "assert all(callable(f) for f in (verify, simulate, plan, lower_bound, load_cluster))\n"
            "assert callable(topoplan.verify) and callable(topoplan.simulate)\n"
            "import sys; assert 'torch' not in sys.modules and 'mpi4py' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)
