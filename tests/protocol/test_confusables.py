"""UTS #39's skeleton (`rbroker_protocol.confusables`): the prototype mapping is read whole
from the file beside the module, the skeletons of Unicode's own examples, and the look keys
that compare names in any case."""

from __future__ import annotations

import pytest

from rbroker_protocol import confusables
from rbroker_protocol.confusables import look_keys, skeleton


def test_the_whole_mapping_is_read() -> None:
    table = confusables._prototypes()
    assert len(table) == 6311  # Unicode 13.0.0's confusables.txt, every MA line
    assert table[ord("\u0456")] == "i" and table[ord("1")] == "l" and table[ord("m")] == "rn"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("pаypal", "paypal"),  # Cyrillic а
        ("vіsion", "vision"),  # Cyrillic і
        ("ⅴision", "vision"),  # Roman numeral five
        ("I1l", "lll"),
        ("modern", "rnodern"),
    ],
)
def test_confusable_pairs_share_a_skeleton(a: str, b: str) -> None:
    assert skeleton(a) == skeleton(b)


@pytest.mark.parametrize(("a", "b"), [("vision", "vlslon"), ("nlp", "nip"), ("scope", "slope")])
def test_different_names_do_not(a: str, b: str) -> None:
    assert not set(look_keys(a)) & set(look_keys(b))


def test_look_keys_see_through_case_and_caseless_scripts() -> None:
    lisu = "\ua4e6\ua4f2\ua4e2\ua4f2\ua4f3\ua4e0"  # ꓦꓲꓢꓲꓳꓠ
    assert set(look_keys(lisu)) & set(look_keys("vision"))
    assert set(look_keys("nIp")) & set(look_keys("nlp"))
    assert look_keys(" ｖｉｓｉｏｎ ")[1] == "vision"
