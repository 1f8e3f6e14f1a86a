"""all-MiniLM-L6-v2's forward pass in numpy against the ONNX Runtime one flakebot ships (issue 20).

    .venv/bin/pip install threadpoolctl        # the numpy encoder's BLAS thread limit; measurement only
    .venv/bin/python benchmarks/compare_encoders.py [--numpy-at COMMIT]

The numpy encoder is run from ``flakebot_magic/registry/embedding.py`` at
``--numpy-at`` (default: the last commit that shipped it), loaded from git as
a module of its own; the ONNX Runtime encoder is this checkout's. Both are
checked against the reference embeddings of
``tests/fixtures/embedding/reference.json`` (made by sentence-transformers),
then timed the same way, alternated: one request at a time (each request of
``tests/search_requests.toml``, twice), and a batch of 200 crates'
descriptions (what building the index does).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flakebot_magic.config import DEBIAN_REGISTRY  # noqa: E402
from flakebot_magic.host.fsutil import load_toml  # noqa: E402
from flakebot_magic.registry import embedding  # noqa: E402
from flakebot_magic.registry.crate_files import read_manifest  # noqa: E402

#: the last commit whose embedding.py ran the forward pass in numpy
NUMPY_AT = "597f6e9"


def numpy_encoder_class(commit: str) -> Any:
    source = subprocess.run(
        ["git", "show", f"{commit}:flakebot_magic/registry/embedding.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="fb-numpy-encoder-")) / "numpy_embedding.py"
    # the module's relative import of errors.py, made absolute
    path.write_text(source.replace("from ..errors import", "from flakebot_magic.errors import"))
    spec = importlib.util.spec_from_file_location("numpy_embedding", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["numpy_embedding"] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module.SentenceEncoder


def main() -> int:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--numpy-at", default=NUMPY_AT)
    args = parser.parse_args()
    model = embedding.find_model()
    if model is None:
        print(f"no model: {embedding.how_to_enable()}", file=sys.stderr)
        return 1
    encoders = {"numpy": numpy_encoder_class(args.numpy_at)(model), "onnxruntime": embedding.SentenceEncoder(model)}
    reference = json.loads((ROOT / "tests" / "fixtures" / "embedding" / "reference.json").read_text())
    expected = np.array(reference["embeddings"], dtype=np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    requests = [r["text"] for r in load_toml(ROOT / "tests" / "search_requests.toml")["request"]]
    descriptions = []
    for manifest in sorted(DEBIAN_REGISTRY.glob("*/Cargo.toml"))[:200]:
        package = read_manifest(manifest).get("package", {})
        descriptions.append(f"{package.get('name')}: {package.get('description', '')}")
    times: dict[str, list[float]] = {name: [] for name in encoders}
    batches: dict[str, list[float]] = {name: [] for name in encoders}
    for name, encoder in encoders.items():
        got = encoder.encode(reference["sentences"])
        print(f"{name}: least cosine to sentence-transformers {float((got * expected).sum(axis=1).min()):.7f}")
    for _ in range(2):
        for name, encoder in encoders.items():
            for text in requests:
                started = time.perf_counter()
                encoder.encode([text])
                times[name].append(time.perf_counter() - started)
            started = time.perf_counter()
            encoder.encode(descriptions)
            batches[name].append(time.perf_counter() - started)
    for name in encoders:
        ordered = sorted(times[name])
        print(
            f"{name}: one request p50 {statistics.median(ordered) * 1000:.2f} ms, "
            f"p95 {ordered[int(len(ordered) * 0.95) - 1] * 1000:.2f} ms; "
            f"200 descriptions {min(batches[name]):.2f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
