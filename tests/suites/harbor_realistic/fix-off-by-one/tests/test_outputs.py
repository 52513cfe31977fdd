import os
import sys

sys.path.insert(0, "/app/pager")
from pager import page

SIZE = int(os.environ["PAGE_SIZE"])


def test_first_page():
    assert page(list(range(10)), 1, SIZE) == [0, 1, 2]


def test_last_page():
    assert page(list(range(10)), 4, SIZE) == [9]
