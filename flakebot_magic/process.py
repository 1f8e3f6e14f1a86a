"""Child processes (cargo, git, the tools): time limits, process groups, live lines.

Every command flakebot runs goes through :class:`ProcessRunner`, so every one
of them has a time limit, runs in its own process group (a timeout or a
cancel kills cargo *and* the rustc processes it started), streams its output
line by line to the pipeline's events, and sees an environment without
secrets.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import Cancelled, ConfigError, StageTimeout

__all__ = ["CancelToken", "Completed", "ProcessRunner", "scrubbed_env"]

_SECRET = re.compile(r"(_API_KEY|_TOKEN|_SECRET|_PASSWORD|_CREDENTIALS?)$|^(AWS_|GH_|GITHUB_TOKEN)", re.I)

#: cap on the output kept in memory per stream (the rest still reaches observers)
MAX_CAPTURE = 64 * 1024 * 1024


def scrubbed_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The current environment without anything that looks like a secret."""
    env = {k: v for k, v in os.environ.items() if not _SECRET.search(k)}
    if extra:
        env.update(extra)
    return env


class CancelToken:
    """Set by a front end (Cancel button, Ctrl-C) to stop the run's current process."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


@dataclass(frozen=True)
class Completed:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    elapsed: float


LineCallback = Callable[[str, str], None]  # (stream, line)


class ProcessRunner:
    """Runs commands with a time limit in their own process group.

    Parameters
    ----------
    cancel
        When set, the running process group is killed and :class:`Cancelled` raised.
    """

    def __init__(self, cancel: CancelToken | None = None) -> None:
        self.cancel = cancel or CancelToken()

    def run(
        self,
        args: Sequence[str | os.PathLike[str]],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 600.0,
        on_line: LineCallback | None = None,
        input: bytes | None = None,
        workspace: Path | None = None,
        interrupt_grace: float = 0.0,
    ) -> Completed:
        """Run ``args``; return its output, whatever its exit code.

        Raises :class:`StageTimeout` past ``timeout`` seconds, :class:`Cancelled`
        when the cancel token is set, :class:`ConfigError` when the program is
        missing. ``workspace`` is attached to those errors.

        ``interrupt_grace``: when stopping the process, send SIGINT first and
        allow it this many seconds to clean up before SIGKILL. nix needs it:
        its builders run in their own session, so only nix itself can stop
        them, and it does so (and releases its locks) on SIGINT.
        """
        argv = [os.fspath(a) for a in args]
        if shutil.which(argv[0], path=(env or os.environ).get("PATH")) is None and not os.path.isabs(argv[0]):
            raise ConfigError(
                f"`{argv[0]}` is not on PATH. Install it (for cargo: `make install` "
                "in the flakebot-magic checkout, or https://rustup.rs) and try again.",
                workspace=workspace,
            )
        if self.cancel.cancelled:
            raise Cancelled("The run was cancelled.", workspace=workspace)
        started = time.monotonic()
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # own process group: kill rustc children too
        )
        out: list[str] = []
        err: list[str] = []

        def pump(stream: object, sink: list[str], name: str) -> None:
            size = 0
            for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
                line = raw.decode("utf-8", "replace")
                if size < MAX_CAPTURE:
                    sink.append(line)
                    size += len(line)
                if on_line is not None:
                    on_line(name, line.rstrip("\n"))

        readers = [
            threading.Thread(target=pump, args=(proc.stdout, out, "stdout"), daemon=True),
            threading.Thread(target=pump, args=(proc.stderr, err, "stderr"), daemon=True),
        ]
        for reader in readers:
            reader.start()
        if input is not None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(input)
                proc.stdin.close()
            except BrokenPipeError:
                pass
        deadline = started + timeout
        try:
            while True:
                try:
                    proc.wait(timeout=0.05)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if self.cancel.cancelled:
                    self._kill(proc, interrupt_grace)
                    raise Cancelled(
                        f"Cancelled while running `{' '.join(argv[:3])}`.", workspace=workspace
                    )
                if time.monotonic() > deadline:
                    self._kill(proc, interrupt_grace)
                    raise StageTimeout(
                        f"`{' '.join(argv[:3])}` ran past its time limit of {timeout:g} s "
                        "and was stopped. Raise the limit (build_timeout / test_timeout) "
                        "if the crate is just slow to build.",
                        command=argv,
                        seconds=timeout,
                        workspace=workspace,
                    )
        except BaseException:
            self._kill(proc, interrupt_grace)  # KeyboardInterrupt too: never leave cargo running
            raise
        finally:
            for reader in readers:
                reader.join(timeout=5)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        return Completed(argv, proc.returncode, "".join(out), "".join(err), time.monotonic() - started)

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes], grace: float = 0.0) -> None:
        if proc.poll() is not None:
            return
        if grace > 0:
            try:
                os.killpg(proc.pid, signal.SIGINT)
                proc.wait(timeout=grace)
                return
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
