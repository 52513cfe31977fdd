import os
import subprocess
from pathlib import Path


def test_script_still_executable():
    assert os.access("/app/tools/report.py", os.X_OK)


def test_script_runs():
    done = subprocess.run(["/app/tools/report.py"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_report():
    assert Path("/app/report.txt").read_text().splitlines() == [
        "bolts: 120 in stock, 6.00 total",
        "gaskets: out of stock",
        "valves: 4 in stock, 78.00 total",
    ]
