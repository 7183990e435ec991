"""`pincer channels add NAME`: a chat app's credentials asked for (or read from flags), tried against the
platform, and only then saved: the channel enabled in the data dir's config.yaml, its secrets in secrets.env.

`pincer setup --channel NAME` runs the same questions. The platform's API root is the channel's own
setting (``api_url``; Matrix's ``homeserver``; email's hosts and ports), so a self-hosted server or a test's
fake is asked instead of the public one.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from typing import Any

from bus.config import Config, ConfigError
from bus.numbers import whole_number
from gateway.channels.config import KNOWN, ChannelCommon, ChannelSettings
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.cli.answers import Asker, Unanswered, config_target, merge_config, outranked, store_secrets

TITLES = {"telegram": "Telegram", "slack": "Slack", "discord": "Discord", "matrix": "Matrix", "email": "email"}


@dataclass(frozen=True)
class Question:
    """One setting a channel is asked for: ``flag`` answers it (a secret: ``--<flag>-file`` or ``--<flag>-env``,
    and it is kept in secrets.env as ``variable``, the config naming it ``${variable}``)."""

    key: str
    ask: str
    flag: str
    variable: str = ""  # a secret's name in secrets.env
    default: str | None = None  # None: an answer is needed
    optional: bool = False  # a secret that may be left empty

    @property
    def dest(self) -> str:
        return self.flag.replace("-", "_")


TOKEN = "token"
QUESTIONS: dict[str, tuple[Question, ...]] = {
    "telegram": (Question("bot_token", "bot token (from @BotFather)", TOKEN, "TELEGRAM_BOT_TOKEN"),),
    "slack": (Question("bot_token", "bot token (xoxb-..., OAuth & Permissions)", TOKEN, "SLACK_BOT_TOKEN"),
              Question("app_token", "app-level token (xapp-..., with connections:write: Socket Mode)", "app-token",
                       "SLACK_APP_TOKEN")),
    "discord": (Question("bot_token", "bot token (the application's Bot page)", TOKEN, "DISCORD_BOT_TOKEN"),),
    "matrix": (Question("homeserver", "homeserver (https://matrix.example.org)", "homeserver"),
               Question("user_id", "the bot's Matrix id (@pincer:example.org)", "user-id"),
               Question("access_token", "access token of the bot's account", TOKEN, "MATRIX_ACCESS_TOKEN")),
    "email": (Question("tls", "TLS: ssl (IMAP 993, SMTP 465), starttls (143, 587) or none (this machine only)",
                       "tls", default="ssl"),
              Question("imap_host", "IMAP server (where the agent's mail is read)", "imap-host"),
              Question("imap_port", "IMAP port", "imap-port", default=""),
              Question("smtp_host", "SMTP server (what the answers are sent through)", "smtp-host"),
              Question("smtp_port", "SMTP port", "smtp-port", default=""),
              Question("username", "login name (for both)", "username"),
              Question("password", "password (for both)", "password", "AGENT_MAIL_PASSWORD"),
              Question("address", "the agent's own address (its answers come from it)", "address", default=""),
              Question("authserv_id", "your receiving server's name in its Authentication-Results headers "
                       "(mx.example.com; empty: believe From lines as written)", "authserv-id", default="")),
}
PORTS = {"ssl": ("993", "465"), "starttls": ("143", "587"), "none": ("143", "25")}


@dataclass
class Answered:
    """A channel's settings as they go in the config (secrets as ``${NAME}``), its secrets, and who it is."""

    name: str
    settings: dict[str, Any]
    secrets: dict[str, str]
    who: str


def ask(name: str, args: argparse.Namespace, asker: Asker, config: Config) -> Answered:
    """The channel's credentials, asked or from flags, and checked against the platform (``PlatformRefused``,
    ``PlatformAway``: nothing is saved); what to save."""
    title = TITLES[name]
    if asker.interactive and not asker.accept_defaults:
        print(f"{title}: {_model(name).HINT} (docs/channels/{name}.md)", file=sys.stderr)
    written: dict[str, Any] = {"enabled": True}
    actual: dict[str, Any] = {}
    secrets: dict[str, str] = {}
    for question in QUESTIONS[name]:
        if question.variable:
            value = asker.secret(f"{title} {question.ask}",
                                 flags=f"--{question.flag}-file PATH or --{question.flag}-env VAR",
                                 from_file=getattr(args, f"{question.dest}_file", None),
                                 from_env=getattr(args, f"{question.dest}_env", None), optional=question.optional)
            if value:
                secrets[question.variable], written[question.key] = value, f"${{{question.variable}}}"
                actual[question.key] = value
            continue
        default = _default(question, actual)
        value = asker.text(f"{title} {question.ask}", flag=f"--{question.flag}", default=default,
                           given=getattr(args, question.dest, None), check=_check(question))
        if value or question.default is None:
            written[question.key] = actual[question.key] = value
    if name == "email" and not actual.get("authserv_id"):
        written["trust_from_header"] = actual["trust_from_header"] = _trust_from(args, asker)
    if getattr(args, "api_url", None):
        if name not in ("telegram", "slack", "discord"):
            raise Unanswered("--api-url is for telegram, slack and discord (matrix: --homeserver; email: the hosts)")
        written["api_url"] = actual["api_url"] = args.api_url
    if getattr(args, "allow", None):
        written["allow_from"] = actual["allow_from"] = list(args.allow)
    settings = _settings(name, config, actual)
    who = asyncio.run(_whoami(settings))
    return Answered(name, written, secrets, who)


def _default(question: Question, actual: dict[str, Any]) -> str | None:
    if question.key in ("imap_port", "smtp_port"):
        return PORTS.get(str(actual.get("tls", "ssl")), PORTS["ssl"])[question.key == "smtp_port"]
    if question.key == "address" and "@" in str(actual.get("username", "")):
        return str(actual["username"])
    return question.default


def _check(question: Question) -> Any:
    if question.key == "tls":
        return lambda answer: None if answer in PORTS else "ssl, starttls or none"
    if question.key.endswith("_port"):
        return lambda answer: None if 0 < (whole_number(answer) or 0) < 65536 else "a port number"
    if question.default is None:
        return lambda answer: None if answer else "an answer is needed"
    return lambda answer: None


def _trust_from(args: argparse.Namespace, asker: Asker) -> bool:
    if getattr(args, "trust_from_header", False):
        return True
    if not asker.interactive or asker.accept_defaults:
        raise Unanswered("an email channel believes a From line only if a server proved it: give --authserv-id NAME "
                         "(the first word of your server's Authentication-Results header), or --trust-from-header "
                         "for a mailbox no stranger's mail reaches (docs/channels/email.md)")
    answer = asker.text("Believe From lines as written (anyone who knows an allowed address can write as them; "
                        "only for a mailbox no stranger's mail reaches)? yes/no", flag="--trust-from-header",
                        default="no", check=lambda a: None if a.lower() in ("yes", "no", "y", "n") else "yes or no")
    if answer.lower().startswith("n"):
        raise Unanswered("nothing saved: give the server's name (--authserv-id) to read mail it proved")
    return True


def _settings(name: str, config: Config, actual: dict[str, Any]) -> ChannelCommon:
    """The channel's settings as its process will read them: the configuration in use (its file and
    PINCER_CHANNELS__... variables: a test's API root), the answers over it, secrets as themselves."""
    section = config.raw.get("channels") or {}
    present = section.get(name) if isinstance(section, dict) else None
    merged = {**(present if isinstance(present, dict) else {}), **actual}
    try:
        settings = _model(name).model_validate(merged)
    except ValueError as exc:
        raise ConfigError(f"channels.{name}: {_first_error(exc)}") from None
    missing = settings.missing()
    if missing:
        raise Unanswered(f"channels.{name} still lacks {', '.join(missing)}")
    return settings


def _model(name: str) -> type[ChannelCommon]:
    """The settings class of the channel ``name``."""
    return type(ChannelSettings().of(name))


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}" if first["loc"] else str(first["msg"])
    return str(exc)


async def _whoami(settings: ChannelCommon) -> str:
    from gateway.channels.verify import whoami

    return await asyncio.wait_for(whoami(settings), 60)


def save(answered: Answered, *, command: str) -> str:
    """The secrets in secrets.env, then the channel in config.yaml; what was done, in a line."""
    where = store_secrets(answered.secrets) if answered.secrets else None
    backup = merge_config(config_target(), {"channels": {answered.name: answered.settings}}, command=command)
    kept = f"; its secrets ({', '.join(answered.secrets)}) in {where}" if where else ""
    moved = f" (the file as it was, with its comments: {backup})" if backup else ""
    return f"{answered.name} enabled in {config_target()}{moved}{kept}"


def add(args: argparse.Namespace, config: Config) -> int:
    """`pincer channels add NAME`."""
    name = args.arg
    if name not in KNOWN:
        print(f"pincer: error: `pincer channels add` takes one of: {', '.join(KNOWN)}", file=sys.stderr)
        return 2
    asker = Asker(accept_defaults=args.yes)
    try:
        answered = ask(name, args, asker, config)
    except Unanswered as exc:
        print(f"pincer: error: {exc}", file=sys.stderr)
        return 2
    except (PlatformRefused, PlatformAway, TimeoutError) as exc:
        print(f"pincer: error: {refusal(exc)}; nothing was saved", file=sys.stderr)
        return 1
    print(f"{TITLES[name]}: the credentials work: {answered.who}")
    print(save(answered, command="channels add"))
    note = outranked(config.source)
    if note:
        print(note, file=sys.stderr)
    print("`pincer up` starts it (`pincer restart` if Pincer is running); `pincer channels` shows its state")
    return 0


def refusal(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "the platform did not answer within 60 s"
    said = str(exc)
    return f"{said} (the platform did not answer: check the address and the network)" \
        if isinstance(exc, PlatformAway) else said


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that answer a channel's questions (for `pincer channels add` and `pincer setup --channel`)."""
    group = parser.add_argument_group("a channel's credentials (each question's answer, without a terminal)")
    secret_flags = {q.flag: q.ask for questions in QUESTIONS.values() for q in questions if q.variable}
    secret_flags[TOKEN] = "bot's token (Matrix: the access token)"
    for flag, what in secret_flags.items():
        group.add_argument(f"--{flag}-file", metavar="PATH", help=f"a file holding the {what.split(' (')[0]}")
        group.add_argument(f"--{flag}-env", metavar="VAR", help="... or the environment variable holding it")
    plain = {q.flag: q.ask for questions in QUESTIONS.values() for q in questions if not q.variable}
    for flag, what in plain.items():
        group.add_argument(f"--{flag}", metavar="VALUE", help=what, choices=list(PORTS) if flag == "tls" else None)
    group.add_argument("--trust-from-header", action="store_true",
                       help="email: believe From lines as written (a mailbox no stranger's mail reaches)")
    group.add_argument("--api-url", metavar="URL", help="telegram, slack, discord: the platform's API root "
                       "(a self-hosted Bot API server, a test's fake)")
    group.add_argument("--allow", action="append", metavar="USER", help="who may talk to the agent at once, in the "
                       "platform's form of a user (repeatable; others are given a pairing code)")
