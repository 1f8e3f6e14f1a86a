"""Hidden checks of hsize: sizes compared with the formatting rule written out in Python."""

DECIMAL = ["B", "KB", "MB", "GB", "TB", "PB", "EB"]
BINARY = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]


def human(count: int, binary: bool = False) -> str:
    divider, units = (1024.0, BINARY) if binary else (1000.0, DECIMAL)
    size, index = float(count), 0
    while size >= divider:
        size /= divider
        index += 1
    places = 0 if size == int(size) else 2
    return f"{size:.{places}f} {units[index]}"


COUNTS = [0, 1, 999, 1000, 1500, 1024, 123_456_789, 5 * 1024**3, 10**15]


def test_decimal(tool):
    assert tool(input="".join(f"{n}\n" for n in COUNTS)) == "".join(f"{human(n)}\n" for n in COUNTS)


def test_binary(tool):
    assert tool("--binary", input="".join(f"{n}\n" for n in COUNTS)) == "".join(
        f"{human(n, binary=True)}\n" for n in COUNTS
    )
