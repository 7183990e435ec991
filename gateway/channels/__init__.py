"""Chat channels: the chat apps people already use (Telegram first), each a process on the bus.

The kit (``worker``, ``intake``, ``platform``, ``access``, ``reply``, ``markup``) is platform-neutral;
a platform is one small module of calls (``telegram``). See docs/channels.md.
"""
