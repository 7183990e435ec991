"""Questions asked on a platform without buttons (email, Matrix): a sent message's choices, kept in Redis so
that a reply or a reaction to it, read by any replica, is understood as the press of a button."""

from __future__ import annotations

import json

from bus.streams import Bus
from gateway.channels.reply import Buttons

ASKED_KEEP_S = 86_400  # a question outlives its turn's timeout


def first_word_choices(buttons: Buttons) -> dict[str, str]:
    """Each button's label, lowercased, as the answer that chooses it."""
    return {label.strip().lower(): data for row in buttons for label, data in row}


class Questions:
    def __init__(self, bus: Bus, channel: str) -> None:
        self.bus, self.channel = bus, channel

    async def ask(self, message_id: str, choices: dict[str, str]) -> None:
        """Remember that ``message_id`` asked a question answered by any of ``choices`` (answer -> data)."""
        await self.bus.redis.set(self.bus.keys.channel_asked(self.channel, message_id), json.dumps(choices),
                                 ex=ASKED_KEEP_S)

    async def answer(self, message_id: str, said: str) -> str | None:
        """The data of the choice ``said`` makes to the question ``message_id`` (None: not a question, or
        not one of its choices)."""
        raw = await self.bus.redis.get(self.bus.keys.channel_asked(self.channel, message_id))
        if raw is None:
            return None
        choices: dict[str, str] = json.loads(raw)
        return choices.get(said.strip(" .!*\t").lower())
