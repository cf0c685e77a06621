"""Read, decide, write with the version read; on a conflict, all of it again, a bounded number of
times."""

from __future__ import annotations

import pytest

from kubeio.errors import APIConflictError, APINotFoundError
from kubeio.retry import on_conflict


def test_a_conflict_runs_the_whole_attempt_again() -> None:
    seen: list[int] = []
    retries: list[int] = []

    def attempt() -> str:
        seen.append(len(seen))
        if len(seen) < 3:
            raise APIConflictError(409, "Conflict", "written meanwhile")
        return "written"

    assert on_conflict(attempt, "cm/x", retrying=lambda: retries.append(1)) == "written"
    assert seen == [0, 1, 2] and retries == [1, 1]


def test_it_gives_up_naming_what_kept_conflicting() -> None:
    def attempt() -> None:
        raise APIConflictError(409, "Conflict", "again")

    with pytest.raises(APIConflictError, match=r"secret/key: kept conflicting \(3 attempts\)"):
        on_conflict(attempt, "secret/key", attempts=3)


def test_other_errors_are_not_retried() -> None:
    calls: list[int] = []

    def attempt() -> None:
        calls.append(1)
        raise APINotFoundError(404, "NotFound", "gone")

    with pytest.raises(APINotFoundError):
        on_conflict(attempt, "cm/x")
    assert calls == [1]
