"""The pipeline: search, fork, build and test, flake, deploy, client, with events.

One :class:`Pipeline` is behind every front door (the magic, the command,
:func:`flakebot_magic.build`). It emits :mod:`flakebot_magic.events`; front
ends only observe them.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import re
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .cargo import Cargo
from .config import Settings
from .errors import ConfigError, DeployError, FlakeError, FlakebotError, NeedsModelError, SearchError, UsageError
from .events import EventBus, Observer, RunFinished, StageFinished, StageStarted
from .fsutil import atomic_write
from .git import Git
from .locks import tool_lock
from .model import HOW_TO_CONFIGURE, ModelConfig
from .policy import Baseline
from .policy import enforce as enforce_policy
from .inventory import Inventory, ToolRecord
from .process import CancelToken, ProcessRunner
from .registry.base import CrateCandidate, Registry
from .registry.directory import read_manifest
from .stages import search as search_stage
from .stages.build import BUILD_FLAGS, check
from .stages.accept import Example, run_examples, split_request
from .stages.client import ToolClient, contract_of, make_tool
from .stages.deploy import StorePath, deploy, lookup, store_key
from .stages.flake import DEFAULT_NIXPKGS_URL, FLAKE_FILE, FLAKE_FORMAT, LOCK_FILE, FlakeMeta, write_flake
from .stages.edit import EditLoop, EditState, read_contract
from .stages.fork import FORK_FORMAT, Workspace, fork
from .stages.nix import (
    Nix,
    NixOptions,
    describe_locked,
    nix_release,
    normalize_flake_ref,
    pending_link,
    record_nix,
    remove_link,
    resolve_backend,
    root_points_to,
)

__all__ = ["Pipeline", "tool_name"]


def tool_name(crate: str) -> str:
    """A valid Python identifier for a crate: ``pulldown-cmark`` -> ``pulldown_cmark``."""
    name = re.sub(r"\W", "_", crate)
    if not name or name[0].isdigit():
        name = "_" + name
    if keyword.iskeyword(name):
        name += "_"
    return name


@dataclass
class _Stage:
    bus: EventBus
    name: str
    detail: str = ""

    def __enter__(self) -> _Stage:
        self.started = time.monotonic()
        self.status = "done"
        self.bus.emit(StageStarted(self.name, self.detail))
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        elapsed = time.monotonic() - self.started
        if exc is not None:
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            self.bus.emit(StageFinished(self.name, "failed", first, elapsed))
        else:
            self.bus.emit(StageFinished(self.name, self.status, self.detail, elapsed))  # type: ignore[arg-type]


class Pipeline:
    """Turns a request into a deployed tool (a :class:`ToolClient`: CLI, MCP or HTTP).

    Parameters
    ----------
    settings
        Cache dir, registry, time limits.
    registry
        A registry object; by default one is opened from ``settings.registry``.
    runner
        Runs every child process (inject one to observe or cancel).
    observers
        Called with every event.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        registry: Registry | None = None,
        runner: ProcessRunner | None = None,
        observers: Iterable[Observer] = (),
        cancel: CancelToken | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.bus = EventBus(observers)
        self.runner = runner or ProcessRunner(cancel)
        self._registry = registry
        #: set once nix has locked the flake: a later nix failure is real, not "offline"
        self._nix_locked = False
        # set by run(): the model (None: deploy as published) and a --continue's target
        self._model: ModelConfig | None = None
        self._request = ""
        self._name: str | None = None
        self._follow_up = False

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = search_stage.open_registry(self.settings.registry, self.settings.cache_dir)
        return self._registry

    # -- the run ------------------------------------------------------------

    def run(
        self, request: str, *, name: str | None = None, crate: str | None = None, follow_up: bool = False
    ) -> ToolClient:
        """Build (or find in the cache) the tool for ``request`` and return it.

        With a model configured (``settings.model``), the edit loop turns the
        forked crate into the tool the request describes. ``follow_up``
        (``--continue``, or ``settings.follow_up``) applies ``request`` to the existing tool ``name``:
        its workspace and history, then rebuilds and redeploys it.
        """
        started = time.monotonic()
        try:
            self._model = self.settings.model_config()
            self._request, self._name = request.strip(), name
            self._follow_up = follow_up or self.settings.follow_up
            # ">>>" examples in the request are acceptance checks, not search words
            search_text, examples = split_request(request.strip())
            tool = self._run(search_text, name, crate)
            if examples:
                tool = self._accept(tool, examples, search_text)
        except BaseException as exc:
            self.bus.emit(RunFinished(ok=False, error=exc, elapsed=time.monotonic() - started))
            raise
        self.bus.emit(RunFinished(ok=True, tool=tool, elapsed=time.monotonic() - started))
        return tool

    def _run(self, request: str, name: str | None, crate: str | None) -> ToolClient:
        if not request and not crate:
            raise UsageError(
                "The request is empty. Say what the tool should do, for example:\n"
                "    %%flakebot --name md\n    Render Markdown text to HTML.\n"
                "or name a crate with --crate NAME."
            )
        if name is not None and not name.isidentifier():
            raise UsageError(f"--name {name!r} is not a valid Python identifier; try {tool_name(name)!r}.")
        settings = self.settings
        backend, why = resolve_backend(settings.backend)
        self.bus.notice("deploy", f"backend: {backend} ({why})")

        with _Stage(self.bus, "search") as stage:
            candidate = self._choose(request, crate)
            stage.detail = f"{candidate.name} {candidate.version}"
        name = name or tool_name(candidate.name)
        # one build per tool name at a time, across kernels: fork may move the workspace aside,
        # deploy swaps the store entry, and `clean` skips what a held lock covers
        with tool_lock(settings.cache_dir, name):
            return self._build(candidate, name, backend, why)

    def _build(self, candidate: CrateCandidate, name: str, backend: str, why: str) -> ToolClient:
        """Everything after the search, under the tool's lock: cache, fork, edit, build, deploy, client."""
        settings = self.settings
        cargo = Cargo(self.registry, self.runner)
        rustc = cargo.rustc_version()

        recipe = self._recipe_path(candidate, rustc, backend)
        auto = why.startswith("auto")
        if not settings.rebuild:
            cached = self._from_recipe(recipe, candidate, name)
            if cached is None and auto and backend == "nix":
                # auto takes what is cached: an earlier offline run may have fallen back to cargo
                cached = self._from_recipe(self._recipe_path(candidate, rustc, "cargo"), candidate, name)
            if cached is not None:
                where = cached.manifest.get("nix_store_path") or str(cached.path)
                for stage_name in ("fork", "build", "test", "flake", "deploy"):
                    self.bus.emit(StageStarted(stage_name))
                    self.bus.emit(StageFinished(stage_name, "cached", where if stage_name == "deploy" else ""))
                return self._client(name, candidate, cached)

        with _Stage(self.bus, "fork", candidate.id) as stage:
            workspace = fork(
                candidate, self.registry, settings.workspaces_dir, name,
                runner=self.runner, bus=self.bus, cargo=cargo, fresh=settings.rebuild or self._fork_afresh(name),
            )
            stage.detail = str(workspace.path)
        cargo = self._edit(workspace, self._confined(workspace, cargo))
        try:
            # the build policy on the tree on disk, before either backend builds it (policy.py)
            enforce_policy(
                workspace.path, allow_build_scripts=settings.allow_build_scripts,
                baseline=Baseline.from_git(Git(workspace.path, self.runner)),
            )
            if backend == "nix":
                self._nix_locked = False
                try:
                    store = self._nix_build_and_deploy(workspace, cargo, rustc, name)
                except FlakeError as exc:
                    if not auto or self._nix_locked:
                        raise
                    # nixpkgs could not be fetched (offline, say): auto means "nix if it can"
                    first = (str(exc).strip().splitlines() or [""])[0][:200]
                    self.bus.notice(
                        "deploy",
                        f"auto: nix could not lock the flake's nixpkgs input ({first}); "
                        "falling back to the cargo backend. Point --nixpkgs at a local nixpkgs, "
                        "or choose with --backend cargo|nix.",
                        "warning",
                    )
                    backend = "cargo"
                    recipe = self._recipe_path(candidate, rustc, backend)
                    store = self._build_and_deploy(workspace, cargo, rustc)
            else:
                store = self._build_and_deploy(workspace, cargo, rustc)
        except FlakebotError as exc:
            exc.keep_workspace(workspace.path)
            raise
        except KeyboardInterrupt:
            self.bus.notice("fork", f"interrupted; the workspace is kept at {workspace.path}", "warning")
            raise
        atomic_write(
            recipe, json.dumps({"store": str(store.path), "hash": store.hash, "backend": backend}), make_parents=True
        )
        if not settings.keep_workspace:
            # the git history stays (it is the tool's provenance); build outputs go
            shutil.rmtree(workspace.path / "target", ignore_errors=True)
        return self._client(name, candidate, store)

    def _choose(self, request: str, crate: str | None) -> CrateCandidate:
        registry = self.registry
        if self._follow_up:
            return self._continued(crate)
        if self._model is not None:
            return self._choose_for_model(request, crate)
        if crate:
            candidate = registry.get(crate)
            if not candidate.has_bin:
                raise NeedsModelError(
                    f"{candidate.id} is a library: it has no binary target to deploy. "
                    "Turning a library into a tool needs a language model (the edit loop). "
                    f"Pick a crate with a binary, or configure a model. {HOW_TO_CONFIGURE}",
                    candidates=[candidate],
                )
            return candidate
        candidates = search_stage.search(registry, request, limit=10, prefer_bin=True)
        if not candidates:
            raise SearchError(
                f"No crate in {registry.id} matches {request!r}. Describe the tool with other "
                "words (what it reads and what it prints), or name a crate with --crate NAME."
            )
        best = candidates[0]
        if best.has_bin:
            best = search_stage.fittest_binary(candidates) or best
        if not best.has_bin:
            listing = "\n".join(
                f"  {c.name} {c.version}{' [bin]' if c.has_bin else ''}: {c.description[:70]}" for c in candidates[:8]
            )
            raise NeedsModelError(
                f"The best match for {request!r} is {best.id}, a library without a binary. "
                "Turning a library into a tool needs a language model (the edit loop); "
                "without one flakebot can only deploy crates that ship a binary.\n"
                f"Candidates found:\n{listing}\n"
                f"Name one with a binary using --crate NAME, or configure a model. {HOW_TO_CONFIGURE}",
                candidates=candidates,
            )
        return best

    def _recipe_path(self, candidate: CrateCandidate, rustc: str, backend: str = "cargo") -> Path:
        registry = self.registry
        signature = getattr(registry, "signature", None)
        parts = [
            candidate.id, candidate.registry, candidate.checksum or "",
            signature() if signature is not None else "", rustc, " ".join(BUILD_FLAGS), str(FORK_FORMAT),
        ]
        if self._model is not None:  # the model wrote the tool: the request and the model decide it too
            parts += ["edit", self._request, self._model.model, self._model.base_url]
        if backend == "nix":  # the nixpkgs input decides the build too
            parts += ["backend=nix", self._nixpkgs_url(), str(FLAKE_FORMAT)]
        key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
        return self.settings.recipes_dir / f"{key}.json"

    def _from_recipe(self, recipe: Path, candidate: CrateCandidate, name: str) -> StorePath | None:
        if self._follow_up:  # new instructions: the recipe of the old request does not apply
            return None
        try:
            data = json.loads(recipe.read_text())
        except (OSError, ValueError):
            return None
        path = Path(data["store"])
        if (path / "manifest.json").is_file():
            store = StorePath(path, data["hash"])
            if data.get("backend") == "nix" and not self._nix_alive(store, name):
                return None
            return store
        return None

    # -- the nix backend ------------------------------------------------------

    def _nixpkgs_url(self) -> str:
        ref = self.settings.nixpkgs
        return normalize_flake_ref(ref) if ref else DEFAULT_NIXPKGS_URL

    def _nix(self) -> Nix:
        settings = self.settings
        options = NixOptions(settings.nix_builders, settings.nix_substituters, settings.nix_trusted_public_keys)
        return Nix(self.runner, options=options)

    def _nix_alive(self, store: StorePath, name: str, nix: Nix | None = None) -> bool:
        """Is the recorded /nix/store path still there? Roots it under ``name`` if so.

        No process runs when the tool's GC root already points at it.
        """
        recorded = store.manifest.get("nix_store_path")
        if not recorded:
            return False
        path, root = Path(recorded), self.settings.gcroots_dir / name
        if root_points_to(root, path):
            return True
        return (nix or self._nix()).add_root(path, root)

    def _nix_build_and_deploy(self, workspace: Workspace, cargo: Cargo, rustc: str, name: str) -> StorePath:
        """Flake first (nix builds it), then ``nix build`` beside ``cargo test``, then a GC root."""
        settings = self.settings
        nix = self._nix()
        git = Git(workspace.path, self.runner)
        crate = workspace.crate

        def log(stage_name: str) -> Callable[[str, str], None]:
            def on_line(stream: str, line: str) -> None:
                self.bus.log(stage_name, line, "stderr" if stream == "stderr" else "stdout")
            return on_line

        with _Stage(self.bus, "flake") as stage:
            write_flake(workspace.path, self._flake_meta(workspace), self._nixpkgs_url())
            git("add", "-f", "--", FLAKE_FILE)  # a git flake shows nix only tracked files
            lock = nix.lock(workspace.path, timeout=settings.build_timeout, on_line=log("flake"))
            self._nix_locked = True
            committed = git.commit(
                "Add flake.nix and flake.lock\n\n"
                "`nix build` builds packages.default, this crate's binaries; flake.lock pins nixpkgs:\n"
                f"{describe_locked(lock.nixpkgs)}",
                [FLAKE_FILE, LOCK_FILE],
            )
            stage.detail = f"{'committed' if committed else 'unchanged'}, nixpkgs {describe_locked(lock.nixpkgs)}"
        key = store_key(git, rustc, ("nix", "build", "packages.default"), backend="nix")
        store = None if settings.rebuild else lookup(settings.store_dir, key, crate.name, crate.version)
        if store is not None and not self._nix_alive(store, name, nix):
            store = None
        pending = pending_link(settings.gcroots_dir, name)
        try:
            if store is not None:
                for stage_name in ("build", "test"):
                    self.bus.emit(StageStarted(stage_name))
                    self.bus.emit(StageFinished(stage_name, "cached", ""))
            else:
                release = nix_release(nix, workspace.path, pending, timeout=settings.build_timeout, on_line=log("build"))
                result = check(
                    workspace.path, cargo, self.bus,
                    build_timeout=settings.build_timeout, test_timeout=settings.test_timeout, release=release,
                )
                built: Path = release.store_path  # type: ignore[attr-defined]
            with _Stage(self.bus, "deploy") as stage:
                if store is None:
                    root = settings.gcroots_dir / name
                    if not nix.add_root(built, root):
                        raise DeployError(f"Could not make {root} a GC root for {built}.")
                    store = record_nix(
                        settings.store_dir, key, crate.name, crate.version, built,
                        {
                            "crate": crate.name, "version": crate.version, "checksum": workspace.checksum,
                            "checksum_kind": workspace.checksum_kind, "registry": crate.registry,
                            "commit": git.head(), "rustc": rustc, "description": crate.description,
                            "backend": "nix", "lock_hash": lock.hash, "nixpkgs": lock.nixpkgs,
                            "nixpkgs_url": self._nixpkgs_url(), "gcroot": str(root),
                            "binaries": sorted(result.build.binaries),
                            "contract": _contract(workspace.path, list(result.build.binaries)),
                            "tests": {"passed": result.tests.passed, "failed": result.tests.failed,
                                      "ignored": result.tests.ignored},
                            "skipped_targets": workspace.skipped_targets,
                            "dropped": [str(d) for d in workspace.dropped],
                        },
                    )
                else:
                    stage.status = "cached"
                stage.detail = str(store.manifest["nix_store_path"])
        finally:
            remove_link(pending)  # the tool's own root (or none) is all a run leaves
        return store

    def _flake_meta(self, workspace: Workspace) -> FlakeMeta:
        crate = workspace.crate
        package = read_manifest(workspace.path / "Cargo.toml").get("package", {})
        return FlakeMeta(
            pname=crate.name,
            version=crate.version,
            description=str(package.get("description", "")),
            license=str(package.get("license", "")),
            main_program=_main_binary(crate, list(crate.bin_names), workspace.path, built=False),
            homepage=str(package.get("homepage") or package.get("repository") or ""),
        )


    def _build_and_deploy(self, workspace: Workspace, cargo: Cargo, rustc: str) -> StorePath:
        settings = self.settings
        git = Git(workspace.path, self.runner)
        key = store_key(git, rustc, BUILD_FLAGS)
        crate = workspace.crate
        store = None if settings.rebuild else lookup(settings.store_dir, key, crate.name, crate.version)
        if store is not None:
            for stage_name in ("build", "test"):
                self.bus.emit(StageStarted(stage_name))
                self.bus.emit(StageFinished(stage_name, "cached", ""))
        else:
            result = check(
                workspace.path, cargo, self.bus,
                build_timeout=settings.build_timeout, test_timeout=settings.test_timeout,
            )
            binaries = result.build.binaries
        with _Stage(self.bus, "flake") as stage:
            write_flake(workspace.path, self._flake_meta(workspace), self._nixpkgs_url())
            stage.detail = "flake.nix committed" if git.commit(
                "Add flake.nix\n\nBuild it with `nix build`; packages.default is this crate's binaries.",
                ["flake.nix"],
            ) else "flake.nix unchanged"
        with _Stage(self.bus, "deploy") as stage:
            if store is None:
                store = deploy(
                    settings.store_dir, key, crate.name, crate.version, binaries,
                    {
                        "crate": crate.name, "version": crate.version, "checksum": workspace.checksum,
                        "checksum_kind": workspace.checksum_kind, "registry": crate.registry,
                        "commit": git.head(), "rustc": rustc, "flags": list(BUILD_FLAGS),
                        "description": crate.description, "backend": "cargo",
                        "contract": _contract(workspace.path, list(binaries)),
                        "skipped_targets": workspace.skipped_targets,
                        "dropped": [str(d) for d in workspace.dropped],
                    },
                )
            else:
                stage.status = "cached"
            stage.detail = str(store.path)
        return store

    # -- the edit loop ----------------------------------------------------------

    def _choose_for_model(self, request: str, crate: str | None) -> CrateCandidate:
        """With a model a library is a fine start: the best match, binary or not."""
        registry = self.registry
        if crate:
            return registry.get(crate)
        if not request:
            raise UsageError("The request is empty: say what the tool should do (the model needs it).")
        candidates = search_stage.boost_exact_terms(search_stage.search(registry, request, limit=10), request)
        if not candidates:
            raise SearchError(
                f"No crate in {registry.id} matches {request!r}. Describe the tool with other "
                "words (what it reads and what it prints), or name a crate with --crate NAME."
            )
        return candidates[0]

    def _continued(self, crate: str | None) -> CrateCandidate:
        """The crate of the tool a ``--continue`` run changes (checks the options first)."""
        name = self._name
        if self._model is None:
            raise UsageError(f"--continue applies new instructions with the edit loop, which needs a model. {HOW_TO_CONFIGURE}")
        if not name:
            raise UsageError("--continue needs --name: the tool whose workspace and history to continue.")
        if crate or self.settings.rebuild:
            raise UsageError("--continue keeps the tool's workspace: it does not go with --crate or --rebuild.")
        if not self._request:
            raise UsageError("--continue needs new instructions, e.g. 'also accept a --upper flag'.")
        workspace = Workspace.load(self.settings.workspaces_dir / name)
        if workspace is None:
            raise UsageError(
                f"There is no workspace for a tool named {name!r} to continue "
                f"(looked in {self.settings.workspaces_dir}). Build it first, without --continue."
            )
        return workspace.crate

    def _fork_afresh(self, name: str) -> bool:
        """A new request on a model-edited workspace starts over (the old one is moved aside)."""
        return not self._follow_up and EditState.exists(self.settings.workspaces_dir / name)

    def _confined(self, workspace: Workspace, cargo: Cargo) -> Cargo:
        """The cargo that builds and tests the fork: in the sandbox (crate code is untrusted, edited or not).

        Without bubblewrap a published crate still builds, with a warning;
        a model's edits are refused unless ``allow_unsandboxed`` says otherwise.
        """
        from .sandbox import Sandbox, SandboxedCargo

        settings = self.settings
        sandbox = Sandbox(workspace.path)
        if not sandbox.isolated:
            if self._model is not None and not settings.allow_unsandboxed:
                raise ConfigError(
                    f"Refusing to let a model edit and build {workspace.crate.name} without a sandbox: "
                    f"{sandbox.why_not}. Model-written code would run with your files, secrets and network. "
                    "Install bubblewrap (`apt-get install bubblewrap`, or `make install`), or, accepting that "
                    "risk, opt in with the `allow_unsandboxed` setting.",
                    workspace=workspace.path,
                )
            self.bus.notice("build", sandbox.notice, "warning")
            return cargo
        self.bus.notice("build", f"cargo runs in a sandbox: {sandbox.describe()}")
        if sandbox.notice:
            self.bus.notice("build", sandbox.notice, "warning")
        return SandboxedCargo(self.registry, self.runner, sandbox, executable=cargo.executable)

    def _edit(self, workspace: Workspace, cargo: Cargo) -> Cargo:
        """Run the edit loop when a model is configured (with ``cargo``, the sandboxed one); return ``cargo``."""
        model = self._model
        if model is None:
            return cargo
        settings = self.settings
        client = None
        try:
            with _Stage(self.bus, "edit", model.describe()) as stage:
                client = model.client()
                loop = EditLoop(
                    workspace.path, client, model, cargo=cargo, bus=self.bus,
                    git=Git(workspace.path, self.runner), crate=workspace.crate,
                    max_iterations=settings.max_iterations, token_budget=settings.token_budget,
                    allow_build_scripts=settings.allow_build_scripts,
                    build_timeout=settings.build_timeout, test_timeout=min(settings.test_timeout, 600.0),
                    max_reply_bytes=settings.max_reply_bytes, max_reply_seconds=settings.max_reply_seconds,
                )
                outcome = loop.run(self._request, follow_up=self._follow_up)
                stage.detail = (
                    f"green after {outcome.iterations} iteration(s), {outcome.model_calls} model call(s), "
                    f"{outcome.tokens:,} tokens; {outcome.contract}: {outcome.summary[:200]}"
                )
        except FlakebotError as exc:
            exc.keep_workspace(workspace.path)
            raise
        except KeyboardInterrupt:
            self.bus.notice("edit", f"interrupted; the workspace is kept at {workspace.path}", "warning")
            raise
        finally:
            if client is not None:
                client.close()
        return cargo

    def _client(self, name: str, candidate: CrateCandidate, store: StorePath) -> ToolClient:
        with _Stage(self.bus, "client", name) as stage:
            manifest = store.manifest
            main = _main_binary(candidate, manifest["binaries"], self.settings.workspaces_dir / name)
            # nix: the tool is the /nix/store path; the cache entry only records it
            deployed = Path(manifest.get("nix_store_path") or store.path)
            contract = manifest.get("contract") or _contract(self.settings.workspaces_dir / name, manifest["binaries"], main)
            tool = make_tool(
                contract=contract,
                start=False,
                name=name,
                binary=deployed / "bin" / main,
                crate=candidate.name,
                version=candidate.version,
                source_hash=store.hash,
                store_path=deployed,
                checksum=manifest.get("checksum", ""),
                backend=manifest.get("backend", "cargo"),
                timeout=self.settings.tool_timeout,
                provenance=manifest,
                lock_hash=manifest.get("lock_hash", ""),
                env=self.settings.tool_env,
                confine=self.settings.confine_tools,
            )
            Inventory(self.settings.tools_dir).save(
                ToolRecord(
                    name=name, crate=candidate.name, version=candidate.version, binary=str(tool.binary),
                    store_path=str(store.path), source_hash=store.hash, checksum=tool.checksum,
                    checksum_kind=manifest.get("checksum_kind", ""), registry=candidate.registry,
                    workspace=str(self.settings.workspaces_dir / name), commit=manifest.get("commit", ""),
                    backend=tool.backend, description=candidate.description, created=time.time(),
                    extra={"entry": str(store.path), "lock_hash": tool.lock_hash, "gcroot": manifest.get("gcroot", "")}
                    if tool.backend == "nix" else {},
                    kind=tool.kind, request=self._request,
                )
            )
            if tool.kind != "cli":  # an MCP server or HTTP service runs from now on
                inventory = Inventory(self.settings.tools_dir)
                tool.on_state = lambda **changes: inventory.update(name, **changes)
                tool.start()  # type: ignore[attr-defined]
                stage.detail = f"{name}: {tool.kind}, pid {tool.pid}"  # type: ignore[attr-defined]
        return tool

    def _accept(self, tool: ToolClient, examples: list[Example], request: str) -> ToolClient:
        """Run the cell's ``>>>`` examples against the deployed tool; report each failure.

        With a model configured, failing examples go back to the edit loop as
        new instructions (a follow-up session on the same workspace), then the
        tool is rebuilt and the examples run again, up to
        ``ACCEPTANCE_ROUNDS`` times or until the loop's budget ends.
        """
        rounds = 0
        while True:
            with _Stage(self.bus, "accept", f"{len(examples)} examples") as stage:
                report = run_examples(examples, {tool.name: tool})
                stage.detail = report.summary()
                for failure in report.failures:
                    self.bus.notice("accept", failure.describe(), "warning")
            tool.acceptance = report
            if report.ok or self._model is None or rounds >= ACCEPTANCE_ROUNDS:
                return tool
            rounds += 1
            self.bus.notice("accept", f"sending {report.failed} failing examples back to the edit loop (round {rounds})")
            self._follow_up = True
            self._request = report.as_request(self._request)
            tool.close()
            tool = self._run(request, tool.name, None)


#: how many times failing acceptance examples go back to the edit loop
ACCEPTANCE_ROUNDS = 2


def _contract(workspace: Path, binaries: list[str], main: str = "") -> dict[str, object]:
    """The tool contract in the workspace's Cargo.toml (a crate without one is a CLI tool)."""
    try:
        manifest = read_manifest(workspace / "Cargo.toml")
    except (OSError, ValueError):
        manifest = {}
    return contract_of(manifest, binaries, main).to_json()


def _main_binary(
    candidate: CrateCandidate, binaries: list[str], workspace: Path | None = None, *, built: bool = True
) -> str:
    """The binary a tool runs: the tool contract's ``bin`` when the workspace has one, else by name.

    ``built``: ``binaries`` were built (the contract's must be among them);
    else they are the registry's names, from before any edit.
    """
    if workspace is not None:
        contract, _ = read_contract(workspace / "Cargo.toml")
        if contract is not None and (contract.bin in binaries or not built):
            return contract.bin
    if candidate.name in binaries:
        return candidate.name
    return sorted(binaries)[0] if binaries else candidate.name
