"""Verifier helpers: bounded, typed, non-empty artifacts and recorded verifier evidence."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pytest_agentcompass import (
    ArtifactError,
    EnvironmentSpec,
    ExecResult,
    LocalEnvironment,
    RunResult,
    RunStatus,
    apply_verifier_result,
    read_artifact,
)
from pytest_agentcompass.environments.conformance import make_plan


async def session_with(tmp_path: Path, files: dict[str, bytes]):  # type: ignore[no-untyped-def]
    provider = LocalEnvironment(EnvironmentSpec(params={"base_dir": str(tmp_path)}))
    session = await provider.open(provider.build_config(make_plan(), "task"))
    for name, data in files.items():
        await session.write_bytes(name, data)
    return session


@pytest.mark.parametrize(
    ("name", "data", "kwargs", "message"),
    [
        ("big.patch", b"x" * 2000, {"max_bytes": 1000}, "is 2000 bytes, over the limit of 1000"),
        ("sub.exe", b"MZ", {"allowed_suffixes": [".patch", ".diff"]}, "has type .exe; allowed: .diff, .patch"),
        ("empty.patch", b"  \n", {}, "is empty: nothing was submitted"),
        ("bin.patch", b"\xff\xfe\x00", {}, "is not UTF-8 text"),
    ],
)
def test_read_artifact_refuses_bad_submissions(
    tmp_path: Path, name: str, data: bytes, kwargs: dict[str, object], message: str
) -> None:
    async def main() -> None:
        session = await session_with(tmp_path, {name: data})
        try:
            with pytest.raises(ArtifactError, match=message.replace(".", r"\.")):
                await read_artifact(session, name, **kwargs)  # type: ignore[arg-type]
        finally:
            await session.close()

    asyncio.run(main())


def test_read_artifact_accepts_a_good_submission(tmp_path: Path) -> None:
    async def main() -> str:
        session = await session_with(tmp_path, {"/work/s.patch": b"+fixed\n"})
        try:
            return await read_artifact(session, "/work/s.patch", allowed_suffixes=[".patch"], max_bytes=100)
        finally:
            await session.close()

    assert asyncio.run(main()) == "+fixed\n"


def test_verifier_evidence_is_recorded_and_truncated() -> None:
    verifier = ExecResult(exit_code=1, stdout="a" * 10_000, stderr="boom", duration=1.5, stdout_truncated=False)
    scored = apply_verifier_result(RunResult("t", output="x"), verifier)
    evidence = scored.metadata["verifier"]
    assert scored.score == 0.0 and scored.status is RunStatus.SCORED
    assert evidence["exit_code"] == 1 and evidence["timed_out"] is False
    assert len(evidence["stdout"]) == 4000 and evidence["stdout_truncated"] is True
    assert evidence["stderr"] == "boom" and evidence["stderr_truncated"] is False
    assert apply_verifier_result(RunResult("t"), ExecResult(exit_code=0)).score == 1.0


def test_a_verifier_timeout_is_an_evaluation_error_not_a_zero() -> None:
    result = apply_verifier_result(RunResult("t"), ExecResult(exit_code=-9, timed_out=True, duration=600))
    assert result.status is RunStatus.EVALUATION_ERROR and result.score is None
    assert "timed out" in (result.error or "")
