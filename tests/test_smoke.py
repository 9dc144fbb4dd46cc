import subprocess
import sys


def test_cli_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "topoplan", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "topo" in out
