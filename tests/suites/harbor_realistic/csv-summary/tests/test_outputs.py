import json
from pathlib import Path


def test_summary_exists():
    assert Path("/app/summary.json").exists()


def test_totals():
    data = json.loads(Path("/app/summary.json").read_text())
    assert data == {"north": 17.5, "south": 5.0, "east": 8.5}
