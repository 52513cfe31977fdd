def page(items, number, size):
    """Items of 1-based page ``number``."""
    start = number * size
    return items[start : start + size]
