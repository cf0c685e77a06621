"""Child processes of the local cluster: started in their own process group, stopped with no orphans.

Every child is a session (and so process-group) leader, so that a terminal's Ctrl-C reaches only
the Python process, which then stops the children in order, and so that stopping kills the whole
group. An attached child also gets ``PR_SET_PDEATHSIG`` = SIGKILL: if the Python process dies
without running its cleanup (SIGKILL, a crash), the kernel kills the child anyway. Detached
children (``gpuplace cluster up``) outlive the command that started them and are stopped later
through their recorded pid and start time (:class:`ProcessRecord`), which guard against pid reuse.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

_PR_SET_PDEATHSIG = 1
_STOP_POLL_SECONDS = 0.02


@dataclass(frozen=True)
class ProcessRecord:
    """What identifies a started process across Python processes: name, pid, kernel start time."""

    name: str
    pid: int
    start_ticks: int
    log: Path

    def alive(self) -> bool:
        """True while the process that was started (not a later one with the same pid) runs."""
        ticks = _start_ticks(self.pid)
        return ticks is not None and ticks == self.start_ticks


class ManagedProcess:
    """A started child process whose output goes to a log file."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self._popen = popen
        self.log = log
        self.record = ProcessRecord(
            name=name, pid=popen.pid, start_ticks=_start_ticks(popen.pid) or 0, log=log
        )

    @property
    def pid(self) -> int:
        return self._popen.pid

    def exit_code(self) -> int | None:
        """None while running, else the exit status (negative: killed by that signal)."""
        return self._popen.poll()

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log, lines)

    def signal_group(self, signum: int) -> None:
        _kill_group(self._popen.pid, signum)

    def wait(self, timeout: float) -> int | None:
        """Waits up to ``timeout`` seconds for the exit; returns the exit status or None."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=timeout)
        return self._popen.poll()


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
    detach: bool = False,
    pass_fds: Sequence[int] = (),
) -> ManagedProcess:
    """Starts ``argv`` in a new session with stdout and stderr appended to ``log``; ``pass_fds``
    stay open in the child (a lock it shares)."""
    preexec: Callable[[], None] | None = None if detach else die_with_parent(os.getpid())
    with open(os.devnull, "rb") as stdin, log.open("ab") as output:
        popen = subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            preexec_fn=preexec,  # noqa: PLW1509 - only async-signal-safe calls, see die_with_parent
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )
    return ManagedProcess(name, popen, log)


def first_exited(processes: Iterable[ManagedProcess], lines: int = 40) -> str | None:
    """Which of ``processes`` (in start order) has exited, with the last ``lines`` of its log;
    None while every one runs."""
    for process in processes:
        code = process.exit_code()
        if code is not None:
            return (
                f"{process.name} exited with status {code}; last lines of {process.log}:\n"
                f"{process.log_tail(lines)}"
            )
    return None


def poll(
    probe: Callable[[], Any],
    timeout: float,
    check_alive: Callable[[], None],
    interval: float = 0.3,
) -> Any:
    """Calls ``check_alive`` (which raises when a component has died), then ``probe``, until
    ``probe`` returns something true, and returns that; None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        check_alive()
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def stop_all(
    processes: Sequence[ManagedProcess], *, grace_seconds: float = 10.0
) -> dict[str, int | None]:
    """Stops the processes in reverse start order: SIGTERM to each group, SIGKILL after the grace.

    Reverse order matters: the apiserver shuts down in about a second while etcd still answers,
    but waits out its retries when etcd has gone first. Returns each process's exit status.
    """
    for process in reversed(processes):
        if process.exit_code() is None:
            process.signal_group(signal.SIGTERM)
            process.wait(timeout=grace_seconds)
        # SIGKILL the group even when the leader has exited: a leftover grandchild would be an orphan.
        process.signal_group(signal.SIGKILL)
        process.wait(timeout=grace_seconds)  # reaps, so no zombie and no ResourceWarning remain
    return {p.name: p.exit_code() for p in processes}


def stop_records(records: Sequence[ProcessRecord], *, grace_seconds: float = 10.0) -> list[str]:
    """Stops processes started by another Python process, in reverse order; returns the names of
    those that were running."""
    stopped = []
    for record in reversed(records):
        if not record.alive():
            continue
        stopped.append(record.name)
        _kill_group(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while record.alive() and time.monotonic() < deadline:
            time.sleep(_STOP_POLL_SECONDS)
        if record.alive():
            _kill_group(record.pid, signal.SIGKILL)
    return stopped[::-1]


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def _kill_group(pgid: int, signum: int) -> None:
    # ESRCH: the group is already gone. EPERM: the pid now belongs to someone else's process.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks); None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces; split after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in {"Z", "X"}:
        return None
    return int(fields[19])


def die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A preexec function that makes the child receive SIGKILL when its parent dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        # The parent may have died between fork and prctl; then nobody would ever stop this child.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


class ProcessGroup:
    """Processes started together (`start`, by the subclass) and stopped together: `stop`, a
    context manager that starts and stops them, and `check_alive`, which raises `error` with the
    log tail of the first that exited."""

    error: type[Exception] = RuntimeError

    def __init__(self) -> None:
        self.processes: list[ManagedProcess] = []

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        stop_all(self.processes)
        self.processes = []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_alive(self) -> None:
        exited = first_exited(self.processes, lines=20)
        if exited is not None:
            raise self.error(exited)
