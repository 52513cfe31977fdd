"""What a user reads: options the README names exist, a checkout's quickstart prints no config warnings."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pytest_agentcompass.harnesses.agents.cli import _parser as _agents_parser
from pytest_agentcompass.reports.cli import _parser

ROOT = Path(__file__).parents[2]


def test_every_option_the_readme_names_exists(pytester: pytest.Pytester) -> None:
    # It named a --resume option that never existed.
    config = pytester.parseconfig("-p", "xdist", "-p", "agentcompass")
    known = set(config._parser.optparser._option_string_actions)  # type: ignore[attr-defined]
    commands = _parser()._subparsers._group_actions[0].choices.values()  # type: ignore[union-attr]
    known |= {flag for command in commands for flag in command._option_string_actions}
    agents = _agents_parser()._subparsers._group_actions[0].choices.values()  # type: ignore[union-attr]
    known |= {flag for command in agents for flag in command._option_string_actions}
    named = {option for command in _our_commands((ROOT / "README.md").read_text()) for option in _options(command)}
    others = {"--ctrf"}  # of pytest-json-ctrf, in a published task's verifier command
    assert named - known - others == set(), "the README names options that do not exist"
    assert {"--agentcompass", "--agentcompass-baseline", "--lf"} <= named  # the scan sees the README's commands


def _our_commands(text: str) -> list[str]:
    """The README's command lines and bare options that are pytest's or this package's: a code
    span or line that starts with ``pytest``, ``python -m`` or an option (the agent CLIs' own
    command lines, ``claude -p ... --verbose``, are theirs)."""
    pieces = re.findall(r"`([^`\n]+)`", text) + text.splitlines()
    return [piece for piece in pieces if re.match(r"\s*(pytest\b|python -m pytest|--)", piece)]


def _options(command: str) -> set[str]:
    return set(re.findall(r"(?<![\w/-])(--[a-z][a-z0-9-]*)", command))


def test_the_quickstart_in_a_checkout_prints_no_config_warning(pytester: pytest.Pytester) -> None:
    # pyproject.toml held pytest-asyncio's options: without that test extra installed (a user's
    # `pip install -e .`), every run printed "PytestConfigWarning: Unknown config option: asyncio_mode".
    shutil.copy(ROOT / "pyproject.toml", pytester.path / "pyproject.toml")
    shutil.copytree(ROOT / "example_suites/quickstart", pytester.path / "example_suites/quickstart")
    (pytester.path / "tests").mkdir()  # as in a checkout: pyproject.toml's testpaths
    result = pytester.runpytest_subprocess("--agentcompass=example_suites/quickstart/agentcompass.yaml")
    result.assert_outcomes(passed=9, failed=3)
    assert "PytestConfigWarning" not in result.stdout.str() + result.stderr.str()
    assert "Unknown config option" not in result.stdout.str() + result.stderr.str()
