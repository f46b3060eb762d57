"""Names that look alike: the skeleton of Unicode Technical Standard #39 (Unicode Security
Mechanisms, §4 "Confusable Detection"), from its prototype mapping (`confusables.txt`
beside this module: Unicode 13.0.0's, comments left out).

- `skeleton(text)`: NFD, each code point replaced by its prototype, NFD again. Two strings
  with one skeleton are *confusable*: `vіsion` with a Cyrillic `і`, `ⅴision` with a Roman
  numeral, `pаypal` with a Cyrillic `а`, `I`, `l` and `1`.
- `look_keys(text)`: the skeletons of the text as written (`nIp` is `nlp`), case-folded
  (`vision`) and upper-cased (the skeleton maps `I` to `l` but keeps `i`, and a script
  without case such as Lisu, `ꓦꓲꓢꓲꓳꓠ`, looks like capitals: `VISION`'s skeleton is its
  skeleton). Two names share a look key when a reader could take one for the other, in
  some case.

The mapping is read once, at the first call (≈ 6 300 entries, a few milliseconds).
"""

from __future__ import annotations

import functools
import unicodedata
from pathlib import Path
from typing import Final

DATA: Final = Path(__file__).with_name("confusables.txt")
"""The prototype mapping: a line `SOURCE;TARGET` per entry (hexadecimal code points,
TARGET one or more separated by spaces); `#` starts a comment line."""


@functools.cache
def _prototypes() -> dict[int, str]:
    """Code point → its prototype string (`str.translate`'s table)."""
    table: dict[int, str] = {}
    for line in DATA.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        source, target = line.split(";")
        table[int(source, 16)] = "".join(chr(int(cp, 16)) for cp in target.split())
    return table


def skeleton(text: str) -> str:
    """UTS #39's skeleton of `text` (see the module's docstring): equal for two strings
    that a reader could take for each other."""
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", text).translate(_prototypes()))


def look_keys(text: str) -> tuple[str, str, str]:
    """The skeletons of `text` in NFKC as written, case-folded and upper-cased, stripped:
    names sharing any are confusable (see the module's docstring)."""
    nfkc = unicodedata.normalize("NFKC", text)
    folded = unicodedata.normalize("NFKC", nfkc.casefold())
    upper = unicodedata.normalize("NFKC", nfkc.upper())
    return skeleton(nfkc).strip(), skeleton(folded).strip(), skeleton(upper).strip()
