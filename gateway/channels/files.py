"""Files through a chat: what a person sends is saved in their own workspace (a daily cap each), and a
file the agent names with ``[attach: PATH]`` is sent from that workspace. Both go through the workspace
boundary, so neither follows a link a sandboxed command planted."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path, PurePosixPath

from bus.log import kv
from bus.protocol import ChannelUpdate, ErrorCode
from bus.scripts import lua
from bus.streams import Bus
from bus.workspace import PathRefused, Workspace
from bus.workspaces import Workspaces
from gateway.channels.config import ChannelCommon
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.platform import Platform, patiently
from gateway.tokens import Identity

log = logging.getLogger("gateway.channels")

ATTACH = re.compile(r"^[ \t]*\[attach:\s*([^\]\n]{1,512})\][ \t]*$", re.M)
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
# Count a person's file for today and refuse it past the cap, in one step (parallel updates cannot pass it).
# KEYS: the identity's counter for today. ARGV: the cap, the key's lifetime in seconds.
TAKE_UPLOAD = lua("gateway.channels.files.take_upload", """
local n = redis.call('incr', KEYS[1])
if n == 1 then redis.call('expire', KEYS[1], ARGV[2]) end
if n > tonumber(ARGV[1]) then redis.call('decr', KEYS[1]) return 0 end
return 1
""")


class ChatFiles:
    def __init__(self, bus: Bus, platform: Platform, settings: ChannelCommon, workspaces: Workspaces,
                 say: Callable[[str, str], Awaitable[str]]) -> None:
        self.bus, self.platform, self.settings, self.workspaces, self.say = bus, platform, settings, workspaces, say
        self.name = platform.name
        self._take_upload = bus.redis.register_script(TAKE_UPLOAD)

    async def save(self, identity: Identity, update: ChannelUpdate) -> str:
        """The person's files, in their own workspace under inbox/<channel>/; what to tell the agent of them.

        Written through the workspace boundary (a new file each, 0600, never through a link planted at its
        name by a sandboxed command), after the per-person daily cap is taken for each."""
        workspace = self.workspaces.of(identity.name)
        folder, notes = f"inbox/{self.name}", []
        for file in update.files:
            shown = file.name or "a file"
            if not await self._may_upload(identity):
                notes.append(f"[The person sent {shown}, but it was not saved: they have sent "
                             f"{self.settings.max_files_per_day} files today (channels.{self.name}.max_files_per_day)]")
                continue
            try:
                data = await patiently(partial(self.platform.fetch_file, file, self.settings.max_file_bytes),
                                       what="fetch a file")
            except (PlatformRefused, PlatformAway) as exc:
                notes.append(f"[The person sent {shown}, but it was not saved: {exc}]")
                continue
            name = SAFE_NAME.sub("_", Path(file.name).name).strip("._") or "file"
            try:
                path = await asyncio.to_thread(_write_new, workspace, folder, name, data)
            except (PathRefused, OSError) as exc:
                log.warning("%s: a file was not saved %s", self.name, kv(user=update.user, error=str(exc)))
                notes.append(f"[The person sent {shown}, but it was not saved: {getattr(exc, 'message', exc)}]")
                continue
            notes.append(f"[The person sent a file, saved in the workspace at {path} ({len(data)} bytes)]")
        return "\n".join(notes)

    async def _may_upload(self, identity: Identity) -> bool:
        day = int(time.time() // 86_400)
        taken = await self._take_upload(keys=[self.bus.keys.upload_quota(identity.name, day)],
                                        args=[self.settings.max_files_per_day, 2 * 86_400])
        return bool(int(taken))

    async def send(self, identity: Identity, chat: str, relative: str) -> None:
        """A file of the person's own workspace, read from the descriptor that was checked (no link followed)."""
        workspace = self.workspaces.of(identity.name)
        try:
            data = await asyncio.to_thread(workspace.read_bytes, relative.strip(), limit=self.settings.max_file_bytes)
        except PathRefused as exc:
            problem = exc.message
            if exc.code is ErrorCode.RESOURCE_EXHAUSTED:
                problem += f" (channels.{self.name}.max_file_bytes)"
            await self.say(chat, f"(could not send {relative}: {problem})")
            return
        name = PurePosixPath(relative.strip()).name
        await patiently(lambda: self.platform.send_file(chat, name, data), what="send a file")


def attachments(answer: str) -> tuple[str, list[str]]:
    """The answer without its ``[attach: PATH]`` lines, and those paths."""
    files = [m.group(1).strip() for m in ATTACH.finditer(answer)]
    return (ATTACH.sub("", answer).strip() if files else answer), files


def _write_new(workspace: Workspace, folder: str, name: str, data: bytes) -> str:
    with workspace.create_new(folder, name) as (path, fd):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    return path
