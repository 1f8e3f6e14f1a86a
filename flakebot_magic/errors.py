"""Every error flakebot raises, one class per pipeline stage.

The tree::

    FlakebotError
    ├── UsageError          bad input from the user (empty cell, unknown option)
    │   ├── ToolBusy        another process is building the same tool name (names it)
    │   ├── ToolArgumentError a tool called with a keyword it does not take (also a TypeError;
    │   │                   suggests the close one)
    │   └── SteeringError   a steering message with no running session to read it, or a bad one
    ├── ConfigError         the machine lacks something (cargo, a registry path)
    ├── SearchError         no candidates, unknown --crate, registry unreachable
    │   └── RegistryError   a registry answered badly (HTTP error, bad checksum)
    ├── ForkError           the published source could not become a workspace
    ├── BuildError          cargo build failed (carries the first diagnostics)
    │   └── TestError       cargo test failed (carries the failing test names)
    │       └── UpstreamTestError  the published crate's own tests fail on this
    │                       toolchain, unedited (names them; not flakebot's doing)
    ├── PolicyError         the workspace holds what flakebot does not build (a new
    │                       build.rs, .cargo/, a path outside, ...; names the files)
    ├── NeedsModelError     the best candidate is a library; a model must write the tool
    ├── EditError           the edit loop stopped short of a green workspace (stuck, ...)
    │   └── BudgetExhausted its iterations or tokens ran out (names the last diagnostics)
    ├── ModelError          the model endpoint failed after the SDK's retries, or kept
    │                       sending unusable replies
    ├── FlakeError          writing, evaluating or building the Nix flake failed
    ├── DeployError         the built binary could not be placed in the store
    │   └── UntrustedPath   a pulled store path is unsigned, signed by no trusted key, or not
    │                       the recorded hash; nothing was fetched or injected (says how to rebuild)
    ├── StageTimeout        a process ran past its time limit
    ├── Cancelled           the user stopped the run
    ├── StorageError        the cache could not be read or written (an OS or SQLite error: I/O,
    │   │                   permissions, a damaged file); says which file and what to do
    │   ├── DiskFull        no space left: how much the work needs, what `clean` can free
    │   ├── CacheFileDamaged a manifest, binary, recipe or card that does not parse or match; `doctor`
    │   │                   sets it aside
    │   └── RegistryDamaged the tool registry cannot be trusted (unreadable, fails
    │                       quick_check, empty while the store is not); `doctor` repairs it
    └── ToolError           a deployed tool failed when called (exit status, MCP or HTTP error)

Every error says what happened and what to do next. Errors raised after the
fork carry ``workspace``, the path of the kept workspace, and mention it.

A message may quote what flakebot does not control (a compiler's output, a
crate's description, a tool's error text), so every message is made safe to
show when the error is made (:func:`flakebot_magic.untrusted.safe_text`);
the attributes (``stderr``, ``diagnostics``) keep the text as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .untrusted import safe_text

__all__ = [
    "BudgetExhausted",
    "BuildError",
    "CacheFileDamaged",
    "Cancelled",
    "ConfigError",
    "DeployError",
    "DiskFull",
    "EditError",
    "FlakeError",
    "FlakebotError",
    "ForkError",
    "ModelError",
    "NeedsModelError",
    "PolicyError",
    "RegistryDamaged",
    "RegistryError",
    "SearchError",
    "StageTimeout",
    "SteeringError",
    "StorageError",
    "TestError",
    "ToolArgumentError",
    "ToolBusy",
    "ToolError",
    "UntrustedPath",
    "UpstreamTestError",
    "UsageError",
]


class FlakebotError(Exception):
    """Base of every flakebot error.

    Parameters
    ----------
    message
        What happened, and what to do about it.
    workspace
        The workspace kept for inspection, when there is one.
    """

    #: the pipeline stage that raised it, for front ends
    stage: str = ""

    def __init__(self, message: str, *, workspace: Path | None = None) -> None:
        self.workspace = workspace
        message = safe_text(message)
        if workspace is not None and str(workspace) not in message:
            message = f"{message}\nThe workspace is kept at {workspace}"
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self)

    def keep_workspace(self, workspace: Path) -> None:
        """Record the kept workspace on an error raised before it was known."""
        if self.workspace is None:
            self.workspace = workspace
            self.args = (f"{self}\nThe workspace is kept at {workspace}",)

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback: the message is the whole story
        return [f"{type(self).__name__}: {self}"]


class UsageError(FlakebotError):
    """The request or its options are wrong; the message says how to write them."""

    stage = "usage"


class ToolBusy(UsageError):
    """Another build of the same tool name is running and did not finish in time.

    ``holder`` describes that build (:class:`flakebot_magic.host.locks.LockHolder`).
    """

    def __init__(self, message: str, *, name: str = "", holder: Any = None) -> None:
        super().__init__(message)
        self.name = name
        self.holder = holder


class SteeringError(UsageError):
    """A steering message could not be queued: no edit session of that tool is running, or the text is bad."""


class ConfigError(FlakebotError):
    """Something flakebot needs is missing from this machine."""

    stage = "config"


class SearchError(FlakebotError):
    """No crate fits the request, or the one asked for is not in the registry."""

    stage = "search"

    def __init__(
        self,
        message: str,
        *,
        candidates: Sequence[Any] = (),
        workspace: Path | None = None,
    ) -> None:
        self.candidates = list(candidates)
        super().__init__(message, workspace=workspace)


class RegistryError(SearchError):
    """A registry could not be read: HTTP failure, bad checksum, broken layout."""


class ForkError(FlakebotError):
    """The crate's published source could not be turned into a git workspace."""

    stage = "fork"


class BuildError(FlakebotError):
    """``cargo build`` failed. ``diagnostics`` holds the compiler's first errors."""

    stage = "build"

    def __init__(
        self,
        message: str,
        *,
        diagnostics: Sequence[Any] = (),
        command: Sequence[str] = (),
        workspace: Path | None = None,
    ) -> None:
        self.diagnostics = list(diagnostics)
        self.command = list(command)
        super().__init__(message, workspace=workspace)


class TestError(BuildError):
    """``cargo test`` failed. ``failed`` names the failing tests."""

    __test__ = False  # not a pytest test class
    stage = "test"
    #: True when the published crate's own tests fail unedited (:class:`UpstreamTestError`)
    upstream = False

    def __init__(
        self,
        message: str,
        *,
        failed: Sequence[str] = (),
        diagnostics: Sequence[Any] = (),
        command: Sequence[str] = (),
        workspace: Path | None = None,
    ) -> None:
        self.failed = list(failed)
        super().__init__(message, diagnostics=diagnostics, command=command, workspace=workspace)


class UpstreamTestError(TestError):
    """The published crate's own tests fail on this toolchain, with nothing of it edited.

    Not a failure flakebot caused: ``upstream`` is True, and ``failed`` names
    the failing tests (or ``diagnostics`` holds why they do not compile).
    """

    upstream = True


class PolicyError(FlakebotError):
    """The workspace breaks the build policy (:mod:`flakebot_magic.sandbox.policy`); ``violations`` names each file."""

    stage = "build"

    def __init__(self, message: str, *, violations: Sequence[Any] = (), workspace: Path | None = None) -> None:
        self.violations = list(violations)
        super().__init__(message, workspace=workspace)


class NeedsModelError(FlakebotError):
    """The best candidates are libraries; writing a tool from one needs a model."""

    stage = "search"

    def __init__(self, message: str, *, candidates: Sequence[Any] = ()) -> None:
        self.candidates = list(candidates)
        super().__init__(message)


class EditError(FlakebotError):
    """The edit loop stopped without a green workspace.

    ``reason`` is ``"stuck"`` (two check runs in a row failed the same way),
    ``"no-tools"``, or for :class:`BudgetExhausted` ``"iterations"`` or
    ``"tokens"``; ``diagnostics`` is the last check run's report.
    """

    stage = "edit"

    def __init__(self, message: str, *, diagnostics: str = "", reason: str = "", workspace: Path | None = None) -> None:
        self.diagnostics = diagnostics
        self.reason = reason
        super().__init__(message, workspace=workspace)


class BudgetExhausted(EditError):
    """The edit loop used all its iterations or tokens; the workspace and its history are kept."""


class ModelError(FlakebotError):
    """The model endpoint failed (after the SDK's retries) or kept sending unusable replies."""

    stage = "edit"

    def __init__(self, message: str, *, status: int | None = None, workspace: Path | None = None) -> None:
        self.status = status
        super().__init__(message, workspace=workspace)


class FlakeError(FlakebotError):
    """Writing, evaluating or building the Nix flake failed.

    ``log_tail``: the end of nix's output (of the build log, for a failed
    build); ``file`` and ``line``: where evaluation failed, in the workspace;
    ``drv``: the derivation whose builder failed.
    """

    stage = "flake"

    def __init__(
        self,
        message: str,
        *,
        log_tail: str = "",
        workspace: Path | None = None,
        file: Path | None = None,
        line: int | None = None,
        drv: str = "",
    ) -> None:
        self.log_tail = log_tail
        self.file = file
        self.line = line
        self.drv = drv
        super().__init__(message, workspace=workspace)


class DeployError(FlakebotError):
    """The built tool could not be placed in the content-addressed store."""

    stage = "deploy"


class UntrustedPath(DeployError):
    """A store path from a binary cache that is not what the notebook recorded, or that no trusted key signed.

    ``path`` is the refused store path, ``cache`` where it was looked up,
    ``reason`` the refusal alone (the message may add what to do next).
    """

    def __init__(self, message: str, *, path: str = "", cache: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.path, self.cache, self.reason = path, cache, reason or message


class StageTimeout(FlakebotError):
    """A process ran past its time limit and was stopped."""

    stage = "timeout"

    def __init__(
        self,
        message: str,
        *,
        command: Sequence[str] = (),
        seconds: float = 0.0,
        workspace: Path | None = None,
    ) -> None:
        self.command = list(command)
        self.seconds = seconds
        super().__init__(message, workspace=workspace)


class Cancelled(FlakebotError):
    """The run was stopped by the user; the workspace is kept."""

    stage = "cancelled"


class StorageError(FlakebotError):
    """The cache dir could not be read or written: an OS or SQLite error, translated once where it happened.

    ``path``: the file or directory concerned; ``errno``: the OS error number
    (None for a SQLite error without one); ``code``: SQLite's extended error
    name (``SQLITE_IOERR_SHMSIZE``), or "".
    """

    stage = "storage"

    def __init__(
        self,
        message: str,
        *,
        path: Path | None = None,
        errno: int | None = None,
        code: str = "",
        workspace: Path | None = None,
    ) -> None:
        self.path = path
        self.errno = errno
        self.code = code
        super().__init__(message, workspace=workspace)


class DiskFull(StorageError):
    """The file system holding the cache is full.

    ``free``: bytes free when it was noticed; ``needed``: bytes the failed
    work had written (it needs at least that much more), 0 when unknown;
    ``reclaimable``: what ``flakebot clean`` would free now, in bytes.
    """

    def __init__(
        self,
        message: str,
        *,
        path: Path | None = None,
        free: int = 0,
        needed: int = 0,
        reclaimable: int = 0,
        errno: int | None = None,
        code: str = "",
        workspace: Path | None = None,
    ) -> None:
        self.free = free
        self.needed = needed
        self.reclaimable = reclaimable
        super().__init__(message, path=path, errno=errno, code=code, workspace=workspace)


class CacheFileDamaged(StorageError):
    """A file in the cache (a store entry's manifest or binary, a recipe, a tool card) is damaged: it does not
    parse, or no longer holds what was recorded. ``path`` names it; ``flakebot doctor`` sets it aside."""


class RegistryDamaged(StorageError):
    """The tool registry cannot be trusted: unreadable, failing ``PRAGMA quick_check``, a record that does not
    parse, or empty while the store holds tools. ``reason`` says which; ``flakebot doctor`` rebuilds it."""

    def __init__(self, message: str, *, reason: str = "", path: Path | None = None, code: str = "") -> None:
        self.reason = reason
        super().__init__(message, path=path, code=code)


class ToolArgumentError(UsageError, TypeError):
    """A tool was called with a keyword it does not take; a ``TypeError`` too, as Python's own calls raise.

    In IPython the message is the whole story: no frame of the client's code.
    """


class ToolError(FlakebotError):
    """A deployed tool failed when called: exit code and standard error attached.

    ``returncode``: a CLI tool's exit status (None after a timeout), or the
    status an MCP server or HTTP service exited with; ``stderr``: its error
    output (for MCP and HTTP tools, the tail of its log, or the error text it
    reported); ``status``: the HTTP status of a service's error answer.
    """

    stage = "tool"

    def __init__(
        self, message: str, *, returncode: int | None = None, stderr: str = "", status: int | None = None
    ) -> None:
        self.returncode = returncode
        self.stderr = stderr
        self.status = status
        super().__init__(message)
