"""Model configuration: presets, keys from the environment, a real openai client built lazily."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from flakebot_magic.config import Settings
from flakebot_magic.errors import ConfigError, UsageError
from flakebot_magic.llm.model import PROVIDERS, ModelConfig
from flakebot_magic.testing.fake_openai import MODEL_NAME, FakeOpenAIServer


@pytest.mark.parametrize(
    ("provider", "base_url", "key_env"),
    [
        ("openai", "https://api.openai.com/v1", "OPENAI_API_KEY"),
        ("groq", "https://api.groq.com/openai/v1", "GROQ_API_KEY"),
        ("ollama", "http://localhost:11434/v1", "OLLAMA_API_KEY"),
        ("openrouter", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
        ("llamacpp", "http://localhost:8080/v1", "LLAMACPP_API_KEY"),
        ("vllm", "http://localhost:8000/v1", "VLLM_API_KEY"),
        ("lmstudio", "http://localhost:1234/v1", "LMSTUDIO_API_KEY"),
    ],
)
def test_presets_know_their_endpoint_and_key(provider: str, base_url: str, key_env: str) -> None:
    config = ModelConfig.resolve("some-model", provider=provider)
    assert config is not None
    assert (config.base_url, config.key_env, config.provider) == (base_url, key_env, provider)
    assert set(PROVIDERS) == {"openai", "groq", "ollama", "openrouter", "llamacpp", "vllm", "lmstudio"}


def test_no_model_is_no_configuration() -> None:
    assert ModelConfig.resolve(None) is None
    assert ModelConfig.resolve("") is None
    assert Settings(model=None, base_url=None, provider=None).model_config() is None


def test_a_base_url_or_provider_without_a_model_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="without --model"):
        ModelConfig.resolve(None, base_url="http://127.0.0.1:1/v1")
    with pytest.raises(UsageError, match="without --model"):
        ModelConfig.resolve(None, provider="groq")


def test_unknown_provider_and_bad_url_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="openai, groq, ollama, openrouter"):
        ModelConfig.resolve("m", provider="nope")
    with pytest.raises(UsageError, match="not an http"):
        ModelConfig.resolve("m", base_url="localhost:11434")


def test_base_url_wins_over_the_preset_and_is_normalised() -> None:
    config = ModelConfig.resolve("llama3", provider="ollama", base_url="http://10.0.0.5:11434/v1/")
    assert config is not None and config.base_url == "http://10.0.0.5:11434/v1"
    assert config.key_env == "OLLAMA_API_KEY"


def test_the_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GROQ_API_KEY", "gsk-test")
    config = ModelConfig.resolve("m", provider="groq")
    assert config is not None and config.api_key() == "gsk-test"
    monkeypatch.delenv("GROQ_API_KEY")
    with pytest.raises(ConfigError, match="set GROQ_API_KEY"):
        config.api_key()
    assert "gsk" not in config.describe() and "gsk" not in str(config.to_json())


def test_local_endpoints_need_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OLLAMA_API_KEY", raising=False)
    for config in (
        ModelConfig.resolve("m", base_url="http://127.0.0.1:8000/v1"),
        ModelConfig.resolve("m", provider="ollama"),
    ):
        assert config is not None and config.api_key()


def test_settings_read_the_model_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAKEBOT_MODEL", "scripted")
    monkeypatch.setenv("FLAKEBOT_BASE_URL", "http://127.0.0.1:9/v1")
    config = Settings().model_config()
    assert config is not None and (config.model, config.base_url) == ("scripted", "http://127.0.0.1:9/v1")


def test_the_client_is_a_real_openai_client_talking_to_the_endpoint(
    fake_openai: Callable[..., FakeOpenAIServer],
) -> None:
    server = fake_openai([{"role": "assistant", "content": "hello"}])
    config = ModelConfig.resolve("scripted", base_url=server.base_url)
    assert config is not None
    client = config.client()
    try:
        reply = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}])
    finally:
        client.close()
    assert reply.choices[0].message.content == "hello" and reply.model == MODEL_NAME
    assert server.recorded[-1]["headers"]["authorization"] == "Bearer <redacted>"


def test_importing_the_package_does_not_import_openai() -> None:
    probe = (
        "import sys, flakebot_magic, flakebot_magic.llm.model, flakebot_magic.pipeline; print('openai' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("provider", ["ollama", "llamacpp", "vllm", "lmstudio"])
def test_local_presets_need_no_key_and_start_native_then_text(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROVIDERS[provider].key_env, raising=False)
    config = ModelConfig.resolve("qwen2.5-coder:7b", provider=provider)
    assert config is not None and config.keyless and config.api_key() == "no-key-needed"
    assert config.tool_format == "auto" and PROVIDERS[provider].quirks


def test_the_tool_format_is_the_options_or_the_presets_and_checked() -> None:
    assert ModelConfig.resolve("m", provider="ollama", tool_format="text").tool_format == "text"  # type: ignore[union-attr]
    assert Settings(model="m", provider="vllm", tool_format="native").model_config().tool_format == "native"  # type: ignore[union-attr]
    with pytest.raises(UsageError, match="--tool-format 'xml'"):
        ModelConfig.resolve("m", tool_format="xml")
