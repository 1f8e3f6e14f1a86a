"""flakebot's own directories in a workspace: made real, whatever untrusted code left at their names."""

from __future__ import annotations

from pathlib import Path

import pytest

from flakebot_magic.host.fsutil import UnsafePath, real_dir, sha256_regular


def test_real_dir_replaces_a_link_or_a_file_at_any_component_and_never_follows_it(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (ws / "target").symlink_to(outside)
    made = real_dir(ws, ws / "target" / "flakebot-test" / "debug")
    assert made == ws / "target" / "flakebot-test" / "debug" and made.is_dir()
    assert not (ws / "target").is_symlink() and list(outside.iterdir()) == []
    (ws / "target" / "flakebot-test" / "debug").rmdir()
    (ws / "target" / "flakebot-test" / "debug").write_text("a file")
    assert real_dir(ws, ws / "target" / "flakebot-test" / "debug").is_dir()
    (ws / "target" / "flakebot-test" / "debug" / "keep").write_text("kept")
    real_dir(ws, ws / "target" / "flakebot-test" / "debug")  # a real directory stays as it is
    assert (ws / "target" / "flakebot-test" / "debug" / "keep").read_text() == "kept"
    with pytest.raises(UnsafePath, match="is not inside"):
        real_dir(ws, outside / "x")


def test_sha256_regular_refuses_a_link(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert sha256_regular(tmp_path / "a") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    with pytest.raises(UnsafePath, match="symlink"):
        sha256_regular(tmp_path / "b")


def test_real_dir_from_many_threads_at_once(tmp_path: Path) -> None:
    """The build and the test beside it make the same directories: neither fails because the other made one
    first (a build failed with 'Is a directory (target/flakebot-tmp)' under load)."""
    import threading

    errors: list[BaseException] = []
    for round_ in range(30):
        root = tmp_path / f"w{round_}"
        root.mkdir()
        barrier = threading.Barrier(8)

        def make(root: Path = root, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                real_dir(root, root / "target" / "flakebot-tmp")
            except BaseException as exc:  # collected, asserted below
                errors.append(exc)

        threads = [threading.Thread(target=make) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert (root / "target" / "flakebot-tmp").is_dir()
    assert errors == []
