"""Random ids (request ids, completion ids) without a system call each.

`os.urandom` is a system call: about 10 µs each on the machines we measure on, and two per
request were a tenth of the gateway's own work. The ids are drawn from a 4 KiB block of
`os.urandom` bytes, refilled when used up: as unpredictable as uuid4's, one system call per 256.
"""

from __future__ import annotations

import os

BLOCK_BYTES = 4096


class RandomIds:
    __slots__ = ("block", "offset")

    def __init__(self) -> None:
        self.block = b""
        self.offset = 0

    def hex(self, size: int = 16) -> str:
        """`size` random bytes as lower-case hex."""
        start = self.offset
        if start + size > len(self.block):
            self.block, start = os.urandom(BLOCK_BYTES), 0
        self.offset = start + size
        return self.block[start : start + size].hex()

    def forget(self) -> None:
        """A forked child must not hand out the ids its parent will."""
        self.block, self.offset = b"", 0

    def uuid(self) -> str:
        """A random (version 4) UUID in its usual text form: the form upstream servers that check
        request ids accept (llama.cpp's refuses any other)."""
        h = self.hex(16)
        variant = "89ab"[int(h[16], 16) & 3]
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:]}"


IDS = RandomIds()
random_hex = IDS.hex
new_request_id = IDS.uuid
os.register_at_fork(after_in_child=IDS.forget)
