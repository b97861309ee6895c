"""backends.stop_strings: how much of streamed text waits because it could begin a stop string
(what TGI's StopTrimmer and the local backend's TextAssembler both hold back)."""

from __future__ import annotations

import pytest

from backends.stop_strings import held_back


@pytest.mark.parametrize(
    ("text", "stops", "held"),
    [
        ("hello", [], 0),
        ("hello", ["STOP"], 0),
        ("hello S", ["STOP"], 1),
        ("hello ST", ["STOP"], 2),
        ("hello STO", ["STOP"], 3),
        ("hello STOP", ["STOP"], 4),  # a whole stop string is held too (TGI cuts it at the end)
        ("hello STOPx", ["STOP"], 0),
        ("ab", ["b", "abc"], 2),  # the longest beginning of any of them
        ("xa", ["ab", "b"], 1),
        ("", ["a"], 0),
        ("abc", [""], 0),  # an empty stop string holds nothing
        ("café crè", ["crème"], 3),
    ],
)
def test_held_back(text: str, stops: list[str], held: int) -> None:
    assert held_back(text, stops) == held
