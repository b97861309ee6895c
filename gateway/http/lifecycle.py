"""What the server and the app tell each other about their life: whether the server is draining
(read by /ready), and how the app takes new settings (the server's SIGHUP and file watch call it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config.settings import Settings


async def cannot_reload(settings: Settings) -> None:
    raise RuntimeError("this app takes no new settings")


@dataclass(slots=True)
class Lifecycle:
    draining: bool = False
    reload: Callable[[Settings], Awaitable[None]] = cannot_reload
