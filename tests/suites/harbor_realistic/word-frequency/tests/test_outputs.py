import os
from pathlib import Path

RESULT = Path("/app/top_words.txt")


def test_result_exists():
    assert RESULT.exists(), f"{RESULT} was not written"


def test_ranking():
    expected = ["the 6", "boats 3", "tide 3"][: int(os.environ["EXPECTED_TOP_N"])]
    assert RESULT.read_text().splitlines() == expected
