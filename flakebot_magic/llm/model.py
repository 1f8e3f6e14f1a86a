"""Which language model the edit loop talks to: any OpenAI-compatible endpoint, and presets.

A :class:`ModelConfig` names a model, the endpoint's base URL and the
environment variable that holds its key. Presets know the base URL and key
variable of common providers (``--provider groq``). The ``openai`` client is
built lazily by :meth:`ModelConfig.client`: importing :mod:`flakebot_magic`
never imports ``openai``.

The key is read from the environment when the client is built, and is never
written anywhere nor passed to a child process (cargo runs with an
environment stripped of secrets, see :mod:`flakebot_magic.sandbox`).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..errors import ConfigError, UsageError
from .limits import MODEL_TIMEOUT

if TYPE_CHECKING:
    import openai

__all__ = ["PROVIDERS", "TOOL_FORMATS", "ModelConfig", "Provider"]

#: how the edit protocol's functions may be offered to a model (``--tool-format``)
TOOL_FORMATS = ("native", "text", "auto")


@dataclass(frozen=True)
class Provider:
    """An OpenAI-compatible service: where it answers and which variable holds its key."""

    name: str
    base_url: str
    key_env: str
    #: True when the endpoint accepts requests without a key (a local server)
    keyless: bool = False
    #: how the edit protocol's functions are offered by default (``--tool-format``)
    tool_format: str = "auto"
    #: what is known of the server's function calling (documented, not tried here: no such server is reachable)
    quirks: str = ""


#: the presets ``--provider`` accepts
PROVIDERS: dict[str, Provider] = {
    p.name: p
    for p in (
        Provider("openai", "https://api.openai.com/v1", "OPENAI_API_KEY"),
        Provider("groq", "https://api.groq.com/openai/v1", "GROQ_API_KEY"),
        Provider(
            "ollama",
            "http://localhost:11434/v1",
            "OLLAMA_API_KEY",
            keyless=True,
            quirks="native calls for models whose template has tools (qwen2.5-coder, llama3.1); "
            "other models write their calls as text in the content",
        ),
        Provider("openrouter", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
        Provider(
            "llamacpp",
            "http://localhost:8080/v1",
            "LLAMACPP_API_KEY",
            keyless=True,
            quirks="llama-server parses calls only when started with --jinja; without it `tools` is refused "
            "or ignored and calls come as text",
        ),
        Provider(
            "vllm",
            "http://localhost:8000/v1",
            "VLLM_API_KEY",
            keyless=True,
            quirks="native calls only when started with --enable-auto-tool-choice --tool-call-parser NAME; "
            "otherwise a request with `tools` is answered HTTP 400",
        ),
        Provider(
            "lmstudio",
            "http://localhost:1234/v1",
            "LMSTUDIO_API_KEY",
            keyless=True,
            quirks="native calls for models it knows to support them; others answer in their own text dialect",
        ),
    )
}

#: the key variable of an endpoint given only by ``--base-url``
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
#: sent when a local endpoint needs no key (the SDK insists on one)
_NO_KEY = "no-key-needed"

HOW_TO_CONFIGURE = (
    "Configure a model with --model NAME and either --provider (openai, groq, openrouter; the key comes "
    "from OPENAI_API_KEY, GROQ_API_KEY, ... in the environment; or a local server: ollama, llamacpp, vllm, "
    "lmstudio) "
    "or --base-url URL for any OpenAI-compatible endpoint; in a notebook, "
    "`%config FlakebotMagics.model = 'NAME'` (and FlakebotMagics.provider / base_url)."
)


def _is_local(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ModelConfig:
    """A model on an OpenAI-compatible endpoint.

    Parameters
    ----------
    model
        The model's name as the endpoint knows it (``gpt-4o-mini``, ``llama3.1``).
    base_url
        The endpoint, ending in ``/v1`` for most servers. Default: the
        provider's, else OpenAI's.
    provider
        A preset from :data:`PROVIDERS`.
    key_env
        The environment variable holding the key. Default: the provider's,
        else ``OPENAI_API_KEY``. A local endpoint (127.0.0.1, localhost)
        needs none.
    timeout
        Seconds allowed for one request before the SDK retries it.
    max_retries
        The SDK's retries for connection errors, timeouts, 429 and 5xx.
    stream
        Ask for streamed replies (most servers support it).

    Examples
    --------
    >>> ModelConfig.resolve("llama-3.3-70b-versatile", provider="groq").base_url
    'https://api.groq.com/openai/v1'
    """

    model: str
    base_url: str = PROVIDERS["openai"].base_url
    provider: str | None = None
    key_env: str = DEFAULT_KEY_ENV
    timeout: float = MODEL_TIMEOUT
    max_retries: int = 2
    stream: bool = True
    #: how the functions are offered: native (``tools``), text (the system prompt), auto (native, then text)
    tool_format: str = "auto"

    @classmethod
    def resolve(
        cls,
        model: str | None,
        *,
        base_url: str | None = None,
        provider: str | None = None,
        key_env: str | None = None,
        tool_format: str | None = None,
        **options: Any,
    ) -> ModelConfig | None:
        """The configuration the options describe, or None when no model is named.

        Raises :class:`UsageError` for an unknown provider, or a base URL or
        provider without a model.
        """
        if not model:
            if base_url or provider:
                raise UsageError(
                    f"{'--base-url' if base_url else '--provider'} was given without --model. " + HOW_TO_CONFIGURE
                )
            return None
        preset = None
        if provider:
            preset = PROVIDERS.get(provider.lower())
            if preset is None:
                raise UsageError(
                    f"Unknown provider {provider!r}: use one of {', '.join(PROVIDERS)}, "
                    "or --base-url for any other OpenAI-compatible endpoint."
                )
        url = (base_url or (preset.base_url if preset else PROVIDERS["openai"].base_url)).rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--base-url {base_url!r} is not an http(s) URL, e.g. http://localhost:11434/v1")
        env = key_env or (preset.key_env if preset else DEFAULT_KEY_ENV)
        form = (tool_format or (preset.tool_format if preset else "auto")).lower()
        if form not in TOOL_FORMATS:
            raise UsageError(f"--tool-format {tool_format!r}: use one of {', '.join(TOOL_FORMATS)}.")
        return cls(
            model=model,
            base_url=url,
            provider=preset.name if preset else None,
            key_env=env,
            tool_format=form,
            **options,
        )

    def with_options(self, **changes: Any) -> ModelConfig:
        return replace(self, **changes)

    @property
    def keyless(self) -> bool:
        preset = PROVIDERS.get(self.provider or "")
        return _is_local(self.base_url) or bool(preset and preset.keyless and self.base_url == preset.base_url)

    def api_key(self) -> str:
        """The key from the environment; a placeholder for local endpoints.

        Raises :class:`ConfigError` naming the variable when a remote
        endpoint has no key.
        """
        key = os.environ.get(self.key_env, "")
        if key:
            return key
        if self.keyless:
            return _NO_KEY
        raise ConfigError(
            f"No API key for {self.base_url}: set {self.key_env} in the environment "
            f"(e.g. `export {self.key_env}=...` before starting Jupyter), or use a local "
            "endpoint (--provider ollama)."
        )

    def client(self, *, http_client: Any = None) -> openai.OpenAI:
        """A real ``openai.OpenAI`` client for this endpoint (imports openai now)."""
        import openai

        return openai.OpenAI(
            base_url=self.base_url,
            api_key=self.api_key(),
            timeout=self.timeout,
            max_retries=self.max_retries,
            http_client=http_client,
        )

    def describe(self) -> str:
        """``model at base_url`` (no key, ever)."""
        via = f" ({self.provider})" if self.provider else ""
        return f"{self.model} at {self.base_url}{via}"

    def to_json(self) -> dict[str, Any]:
        """What the store manifest records about the model (no key)."""
        return {"model": self.model, "base_url": self.base_url, "provider": self.provider}
