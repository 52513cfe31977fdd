"""Reuse-mode verifier: the agent must have left greeting.txt saying hello."""

import pathlib
import sys

text = pathlib.Path("greeting.txt").read_text() if pathlib.Path("greeting.txt").exists() else ""
print(f"greeting.txt: {text!r}")
sys.exit(0 if text.strip() == "hello" else 1)
