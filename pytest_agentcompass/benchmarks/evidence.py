"""Helpers for production verifiers: bounded artifacts and recorded verifier evidence."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from ..vocabulary.errors import ArtifactError
from ..vocabulary.types import ExecResult, RunResult, RunStatus

if TYPE_CHECKING:
    from ..environments.base import EnvironmentSession

__all__ = ["EVIDENCE_OUTPUT_LIMIT", "apply_verifier_result", "read_artifact", "verifier_evidence"]

#: Characters of verifier stdout/stderr kept in a result's evidence.
EVIDENCE_OUTPUT_LIMIT = 4000


async def read_artifact(
    env: EnvironmentSession,
    path: str,
    *,
    max_bytes: int = 1024 * 1024,
    allowed_suffixes: Iterable[str] | None = None,
    allow_empty: bool = False,
) -> str:
    """Read a text submission from ``env`` with the checks a verifier needs.

    :raises ArtifactError: when the file has the wrong type, is larger than
        ``max_bytes``, is not UTF-8, or is empty (unless ``allow_empty``).
    """
    if allowed_suffixes is not None:
        allowed = {s.lower() for s in allowed_suffixes}
        if PurePosixPath(path).suffix.lower() not in allowed:
            raise ArtifactError(
                f"artifact {path!r} has type {PurePosixPath(path).suffix or '(none)'}; "
                f"allowed: {', '.join(sorted(allowed))}"
            )
    data = await env.read_bytes(path)
    if len(data) > max_bytes:
        raise ArtifactError(f"artifact {path!r} is {len(data)} bytes, over the limit of {max_bytes}")
    if not data.strip() and not allow_empty:
        raise ArtifactError(f"artifact {path!r} is empty: nothing was submitted")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"artifact {path!r} is not UTF-8 text: {exc}") from None


def verifier_evidence(verifier: ExecResult, limit: int = EVIDENCE_OUTPUT_LIMIT) -> dict[str, Any]:
    """Return code, timeout state and the tail of the output, marked when cut."""

    def tail(text: str, cut_before: bool) -> tuple[str, bool]:
        if len(text) <= limit:
            return text, cut_before
        return text[-limit:], True

    stdout, out_cut = tail(verifier.stdout, verifier.stdout_truncated)
    stderr, err_cut = tail(verifier.stderr, verifier.stderr_truncated)
    return {
        "exit_code": verifier.exit_code,
        "timed_out": verifier.timed_out,
        "stdout": stdout,
        "stderr": stderr,
        "stdout_truncated": out_cut,
        "stderr_truncated": err_cut,
        "duration": round(verifier.duration, 3),
    }


def apply_verifier_result(result: RunResult, verifier: ExecResult, *, score: float | None = None) -> RunResult:
    """Score ``result`` from a verifier run and record the evidence in ``metadata['verifier']``.

    Exit code 0 scores 1.0 and anything else 0.0, unless ``score`` is given.
    A verifier that timed out is an evaluation error, not a zero: the
    verifier did not decide.
    """
    metadata = {**result.metadata, "verifier": verifier_evidence(verifier)}
    if verifier.timed_out:
        return dataclasses.replace(
            result,
            score=None,
            status=RunStatus.EVALUATION_ERROR,
            error=f"verifier timed out after {verifier.duration:.1f}s",
            metadata=metadata,
        )
    value = score if score is not None else (1.0 if verifier.exit_code == 0 else 0.0)
    return dataclasses.replace(result, score=value, status=RunStatus.SCORED, metadata=metadata)
