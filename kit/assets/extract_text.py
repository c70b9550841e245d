"""Re-extract the shipped text sample from the Debian package ``r-cran-janeaustenr``.

Provenance only: the text files are shipped, so nothing needs this at run time.
It reads R's lazy-load database (zlib blobs of R-serialized character vectors)
without needing R, and writes Pride and Prejudice chapters 1-20 (train) and
21-23 (test) with one paragraph per line and one empty line between paragraphs,
like wikitext.

    apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb pkg
    python -m kit.assets.extract_text pkg/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb
"""
from __future__ import annotations

import re
import struct
import sys
import zlib

from kit.assets import TEST_TEXT, TRAIN_TEXT

BOOKS = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility"]


def read_rdb(path: str) -> list[list[str]]:
    """Every character vector in an R lazy-load ``.rdb`` file, in file order."""
    data, pos, vectors = open(path, "rb").read(), 0, []
    while pos < len(data):
        d = zlib.decompressobj()
        blob = d.decompress(data[pos + 4:])  # 4-byte length, then one zlib stream
        pos = len(data) - len(d.unused_data)
        p = 2 + 12  # "X\n", format version, R version, min R version
        p += 4 + struct.unpack(">i", blob[p:p + 4])[0]  # native encoding name
        flags, n = struct.unpack(">ii", blob[p:p + 8])
        p += 8
        assert flags & 0xFF == 16, "expected a character vector (STRSXP)"
        lines = []
        for _ in range(n):
            flags, size = struct.unpack(">ii", blob[p:p + 8])
            p += 8
            lines.append("" if size < 0 else blob[p:p + size].decode("utf-8"))
            p += max(size, 0)
        vectors.append(lines)
    return vectors


def paragraphs(lines: list[str]) -> list[str]:
    """Join hard-wrapped lines into one line per paragraph, one empty line between."""
    out, cur = [], []
    for line in lines + [""]:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            out += [" ".join(cur), ""]
            cur = []
    return out


def main(rdb: str) -> None:
    book = read_rdb(rdb)[BOOKS.index("prideprejudice")]
    starts = [i for i, line in enumerate(book) if re.fullmatch(r"Chapter \d+", line)]
    TRAIN_TEXT.write_text("\n".join(paragraphs(book[starts[0]:starts[20]])), encoding="utf-8")
    TEST_TEXT.write_text("\n".join(paragraphs(book[starts[20]:starts[23]])), encoding="utf-8")
    print(f"wrote {TRAIN_TEXT} and {TEST_TEXT}")


if __name__ == "__main__":
    main(sys.argv[1])
