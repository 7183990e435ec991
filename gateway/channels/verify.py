"""A channel's credentials tried against its platform before they are saved: who the bot is, or what failed.

Each check makes the call the channel itself starts with (Telegram getMe, Slack auth.test and, for Socket
Mode, apps.connections.open with the app token, Discord's current user, Matrix whoami, an IMAP login and
an SMTP login), through the same library and at the same API root (the settings' ``api_url``,
``homeserver``, hosts and ports), and translates a failure the way the channel does: ``PlatformRefused``
(the platform said no: a bad token, a wrong password) or ``PlatformAway`` (it did not answer). Nothing
here needs Redis or the bus.
"""

from __future__ import annotations

import contextlib
import ssl

from gateway.channels.config import (
    ChannelCommon,
    DiscordSettings,
    EmailSettings,
    MatrixSettings,
    SlackSettings,
    TelegramSettings,
)
from gateway.channels.errors import PlatformAway, PlatformRefused


async def whoami(settings: ChannelCommon) -> str:
    """What the platform calls the account these credentials belong to (a bot's @name, an address). A failure's
    message never holds a secret (python-telegram-bot quotes a refused token in its own): each is blanked."""
    try:
        return await _whoami(settings)
    except PlatformAway as exc:
        raise PlatformAway(_blanked(str(exc), settings)) from None
    except PlatformRefused as exc:
        raise PlatformRefused(_blanked(str(exc), settings)) from None


def _blanked(message: str, settings: ChannelCommon) -> str:
    for value in settings.secrets().values():
        if value:
            message = message.replace(value, "<the secret given>")
    return message


async def _whoami(settings: ChannelCommon) -> str:
    if isinstance(settings, TelegramSettings):
        return await _telegram(settings)
    if isinstance(settings, SlackSettings):
        return await _slack(settings)
    if isinstance(settings, DiscordSettings):
        return await _discord(settings)
    if isinstance(settings, MatrixSettings):
        return await _matrix(settings)
    if isinstance(settings, EmailSettings):
        return await _email(settings)
    raise TypeError(f"no credentials check for {type(settings).__name__}")


async def _telegram(settings: TelegramSettings) -> str:
    from gateway.channels.telegram import Telegram

    bot = Telegram(settings)
    try:
        await bot.start()
        return f"@{bot.username}"
    finally:
        await bot.close()


async def _slack(settings: SlackSettings) -> str:
    from slack_sdk.web.async_client import AsyncWebClient

    from gateway.channels.slack import TIMEOUT_S, translated

    web = AsyncWebClient(settings.bot_token.get_secret_value(), base_url=settings.api_url, timeout=TIMEOUT_S)
    async with translated("auth.test (bot token)"):
        me = await web.auth_test()
    if settings.app_token.get_secret_value():  # Socket Mode: the app-level token opens its connections
        app = AsyncWebClient(settings.app_token.get_secret_value(), base_url=settings.api_url, timeout=TIMEOUT_S)
        async with translated("apps.connections.open (app token)"):
            await app.apps_connections_open(app_token=settings.app_token.get_secret_value())
    return f"@{me.get('user', '')} in {me.get('team', '') or 'the workspace'}"


async def _discord(settings: DiscordSettings) -> str:
    import discord
    from discord.http import Route

    from gateway.channels.discord_bot import translated

    Route.BASE = settings.api_url  # discord.py reads its REST root from here (as the channel sets it)
    client = discord.Client(intents=discord.Intents.default())
    try:
        async with translated("login"):
            await client.login(settings.bot_token.get_secret_value())
        assert client.user is not None
        return f"@{client.user.name}"
    finally:
        with contextlib.suppress(Exception):
            await client.close()


async def _matrix(settings: MatrixSettings) -> str:
    import nio

    from gateway.channels.matrix_calls import checked, translated

    client = nio.AsyncClient(settings.homeserver, user=settings.user_id,
                             config=nio.AsyncClientConfig(max_limit_exceeded=0, max_timeouts=0, request_timeout=30))
    client.access_token = settings.access_token.get_secret_value()
    try:
        async with translated("whoami"):
            me = checked(await client.whoami(), "whoami")
        if me.user_id != settings.user_id:
            raise PlatformRefused(f"the access token is {me.user_id}'s, not {settings.user_id}'s (the user id given)")
        return str(me.user_id)
    finally:
        with contextlib.suppress(Exception):
            await client.close()


async def _email(settings: EmailSettings) -> str:
    import aioimaplib
    import aiosmtplib

    from gateway.channels.mail import TIMEOUT_S, imap_starttls, translated

    context = None if settings.tls == "none" else ssl.create_default_context(cafile=settings.ca_file or None)
    password = settings.password.get_secret_value()
    async with translated("IMAP login"):
        if settings.tls == "ssl":
            imap: aioimaplib.IMAP4 = aioimaplib.IMAP4_SSL(settings.imap_host, settings.imap_port, timeout=TIMEOUT_S,
                                                          ssl_context=context)
        else:
            imap = aioimaplib.IMAP4(settings.imap_host, settings.imap_port, timeout=TIMEOUT_S)
        await imap.wait_hello_from_server()
        if settings.tls == "starttls":
            await imap_starttls(imap, settings.imap_host, context)
        login = await imap.login(settings.username, password)
        if login.result != "OK":
            raise PlatformRefused(f"email IMAP login: refused for {settings.username} ({_said(login.lines)})")
        selected = await imap.select(settings.mailbox)
        with contextlib.suppress(Exception):
            await imap.logout()
        if selected.result != "OK":
            raise PlatformRefused(f"email IMAP: no mailbox {settings.mailbox!r} ({_said(selected.lines)})")
    smtp = aiosmtplib.SMTP(hostname=settings.smtp_host, port=settings.smtp_port, use_tls=settings.tls == "ssl",
                           start_tls=settings.tls == "starttls", tls_context=context, timeout=TIMEOUT_S)
    async with translated("SMTP login"):
        await smtp.connect()  # the greeting and EHLO (and STARTTLS)
        await smtp.login(settings.username, password)  # as the channel's every send does
        with contextlib.suppress(Exception):
            await smtp.quit()
    return settings.address or settings.username


def _said(lines: list[bytes | bytearray | str]) -> str:
    words = [line.decode(errors="replace") if isinstance(line, bytes | bytearray) else line for line in lines]
    return (words[-1] if words else "no answer")[:200]
