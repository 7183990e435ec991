"""Configuration: one YAML file plus environment overrides, validated per section.

Each package owns the pydantic model of its own section and asks for it with
``Config.section(name, Model)``. Lookup order for the file: ``--config PATH``,
then ``PINCER_CONFIG``, then ``config.yaml`` in the data dir (``PINCER_DATA_DIR``,
else ``~/.pincer``: where ``pincer setup`` writes it), then the defaults shipped in
the package (``bus/default_config.yaml``, the project's ``config.yaml``). A
``config.yaml`` in the current directory is never read on its own: it may be
another project's (the checkout's ``./pincer`` passes its own with ``--config``). Any key
can be overridden as ``PINCER_<SECTION>__<KEY>``
(nested keys joined by ``__``); values are text that the section model
converts (``PINCER_HANDS__CONCURRENCY=4`` is the number 4); lists are
written in YAML flow style (``'[a, b]'``). A key renamed since (``RENAMED``)
is still read under its old name, in the file or the environment, with a warning.
"""

from __future__ import annotations

import logging
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, SecretStr, ValidationError

from bus.errors import PincerError
from bus.settings import RedisSettings, RuntimeSettings

ENV_PREFIX = "PINCER_"
# The shipped defaults: package data in a wheel, a link to the root's config.yaml in a checkout.
DEFAULT_CONFIG = Path(str(resources.files("bus").joinpath("default_config.yaml")))

# Short names for the keys people set most; each maps to one section key.
SHORTCUTS: dict[str, tuple[str, ...]] = {
    "PINCER_REDIS_URL": ("redis", "url"),
    "PINCER_MODEL": ("brain", "model"),
    "PINCER_LLM_API_BASE": ("brain", "api_base"),
    "PINCER_LLM_API_KEY": ("brain", "api_key"),
    "PINCER_WORKSPACE": ("hands", "workspace"),
    "PINCER_DATA_DIR": ("runtime", "data_dir"),
    "PINCER_GATEWAY_PORT": ("gateway", "port"),
    "PINCER_GATEWAY_TOKEN": ("gateway", "token"),
}

# Settings that hold a credential though their type does not say so (a URL may carry a password).
CREDENTIAL_KEYS: frozenset[tuple[str, ...]] = frozenset({("redis", "url")})

# Keys with a new name, old -> new: the old one is still read, as the new one, with a warning.
RENAMED: dict[tuple[str, ...], tuple[str, ...]] = {
    ("hands", "jobs"): ("hands", "background"),  # "job" meant a schedule too
}

log = logging.getLogger("bus.config")
_warned: set[str] = set()  # each warning once a process, however often it loads its configuration

M = TypeVar("M", bound=BaseModel)


EX_CONFIG = 78  # sysexits.h: a service manager must not restart what only a person can fix


class ConfigError(PincerError):
    """A configuration problem a person must fix before Pincer can start (exit status 78)."""


class MissingVariable(ConfigError, ValueError):
    """A setting names ``${NAME}`` and NAME is not set (a ValueError too, so a pydantic validator reports it)."""


REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def from_environment(value: str, *, key: str, process: str = "this process") -> str:
    """Each ``${NAME}`` in ``value`` read from the environment (a secret kept out of the file), or
    ``MissingVariable`` naming the setting and the variable; the rest of ``value`` as written."""
    def lookup(found: re.Match[str]) -> str:
        name = found.group(1)
        if name not in os.environ:
            raise MissingVariable(f"{key} names ${{{name}}}, but {name} is not set in the environment of "
                                  f"{process}: export {name} before starting it, or write the value itself")
        return os.environ[name]

    return REFERENCE.sub(lookup, value)


class RedisUnreachable(PincerError):
    """Redis did not answer at start-up: worth retrying (exit status 1), unlike a bad configuration."""


@dataclass
class Config:
    raw: dict[str, Any] = field(default_factory=dict)
    source: Path | None = None

    def section(self, name: str, model: type[M]) -> M:
        values = self.raw.get(name) or {}
        if not isinstance(values, dict):
            raise ConfigError(
                f"{self._where()}: '{name}' must be a mapping of keys, got {values!r}. "
                f"Fix it in the file or set keys with {ENV_PREFIX}{name.upper()}__<KEY>."
            )
        try:
            return model.model_validate(values)
        except ValidationError as exc:
            raise ConfigError(self._explain(name, exc)) from None

    def check_sections(self, known: set[str]) -> None:
        unknown = sorted(set(self.raw) - known)
        if unknown:
            raise ConfigError(
                f"{self._where()}: unknown section {unknown[0]!r}; known sections: {', '.join(sorted(known))}"
            )

    @property
    def redis(self) -> RedisSettings:
        return self.section("redis", RedisSettings)

    @property
    def runtime(self) -> RuntimeSettings:
        return self.section("runtime", RuntimeSettings)

    def _where(self) -> str:
        return f"config {self.source}" if self.source else "config"

    def _explain(self, name: str, exc: ValidationError) -> str:
        err = exc.errors()[0]
        path = ".".join([name, *(str(p) for p in err["loc"])])
        env = ENV_PREFIX + "__".join(p.upper() for p in path.split("."))
        got = "" if err["type"] == "missing" else f" (got {err.get('input')!r})"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        more = f" and {len(exc.errors()) - 1} more problem(s)" if len(exc.errors()) > 1 else ""
        return f"{self._where()}: {path}: {msg}{got}{more}. Fix it in the file or with {env}."


def load_config(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    source = _find_file(path, env)
    raw: dict[str, Any] = {}
    if source is not None:
        raw = _read_yaml(source)
        _rename_in_file(raw, f"config {source}")
    overrides: list[tuple[tuple[str, ...], Any]] = []
    for key, value in env.items():
        if key in SHORTCUTS:
            overrides.append((SHORTCUTS[key], _scalar(value)))
        elif key.startswith(ENV_PREFIX) and "__" in key:
            parts = tuple(p.lower() for p in key[len(ENV_PREFIX):].split("__"))
            if all(parts):
                overrides.append((parts, _scalar(value)))
    # Renamed on their own, so a variable of either name overrides the file's key of either name.
    for where, value in _rename_in_environment(overrides):
        _set(raw, where, value)
    return Config(raw=raw, source=source)


def _rename_in_file(raw: dict[str, Any], where: str) -> None:
    """Move each old key of the file to its new name; a file that gives both names is refused."""
    for old, new in RENAMED.items():
        holder = _holder(raw, old)
        if holder is None or old[-1] not in holder:
            continue
        old_key, new_key = ".".join(old), ".".join(new)
        target = _holder(raw, new)
        if target is not None and new[-1] in target:
            raise ConfigError(f"{where}: both {old_key} and {new_key} are given; {old_key} is the old name of "
                              f"{new_key}: keep only {new_key}")
        _deprecated(f"{where}: {old_key} is the old name of {new_key}, read as {new_key} for now: rename it")
        _set(raw, new, holder.pop(old[-1]))


def _rename_in_environment(overrides: list[tuple[tuple[str, ...], Any]]) -> list[tuple[tuple[str, ...], Any]]:
    """The environment's settings with each old key under its new name; setting both names is refused."""
    for old, new in RENAMED.items():
        if not any(path[:len(old)] == old for path, _ in overrides):
            continue
        old_name, new_name = (ENV_PREFIX + "__".join(p.upper() for p in path) for path in (old, new))
        if any(path[:len(new)] == new for path, _ in overrides):
            raise ConfigError(f"the environment sets both {old_name}__<KEY> and {new_name}__<KEY>; {old_name} is "
                              f"the old name of {new_name}: set only {new_name}__<KEY>")
        _deprecated(f"{old_name}__<KEY> is the old name of {new_name}__<KEY>, read as the new one for now: "
                    "rename the variables")
        overrides = [(new + path[len(old):] if path[:len(old)] == old else path, value) for path, value in overrides]
    return overrides


def _holder(raw: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    """The mapping that would hold ``path``'s last key, if ``raw`` has it."""
    node: Any = raw
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def _deprecated(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def _find_file(path: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path | None:
    explicit = path or env.get("PINCER_CONFIG")
    if explicit:
        chosen = Path(explicit).expanduser()
        if not chosen.is_file():
            raise ConfigError(f"config file {chosen} does not exist (from --config or PINCER_CONFIG)")
        return chosen
    for candidate in (data_dir_config(env), DEFAULT_CONFIG):
        if candidate.is_file():
            return candidate
    return None


def data_dir_config(env: Mapping[str, str]) -> Path:
    """The data dir's own config file (``pincer setup`` writes it there)."""
    return Path(env.get("PINCER_DATA_DIR") or "~/.pincer").expanduser() / "config.yaml"


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping: YAML keeps the later one without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool):
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice in one section (the later one would win unseen): "
                    "keep one", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _read_yaml(source: Path) -> dict[str, Any]:
    try:
        data = yaml.load(source.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"config {source}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except OSError as exc:
        raise ConfigError(f"config {source}: cannot read it: {exc.strerror}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config {source}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def _scalar(value: str) -> Any:
    # Plain text stays text (pydantic turns "4" into 4 where a number is due);
    # lists and maps are written as YAML/JSON flow: PINCER_X__Y='[a, b]'.
    if value.lstrip()[:1] in ("[", "{"):
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError:
            return value
    return value


def _set(raw: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = raw
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[path[-1]] = value


def secret_variables(sections: Mapping[str, type[BaseModel]]) -> dict[str, str]:
    """Every environment variable that sets a secret setting, and the section it belongs to.

    A setting is secret by what it is, never by its name's ending: a ``SecretStr`` field, or one in
    ``CREDENTIAL_KEYS``. (``..._PER_TOKEN`` limits are settings like any other.)"""
    found: dict[str, str] = {}

    def walk(model: type[BaseModel], path: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            where = (*path, info.alias or name)
            kinds = {info.annotation, *typing.get_args(info.annotation)}
            if SecretStr in kinds or where in CREDENTIAL_KEYS:
                found[ENV_PREFIX + "__".join(where).upper()] = where[0]
            for kind in kinds:
                if isinstance(kind, type) and issubclass(kind, BaseModel):
                    walk(kind, where)

    for section, model in sections.items():
        walk(model, (section,))
    for short, path in SHORTCUTS.items():
        full = ENV_PREFIX + "__".join(path).upper()
        if full in found:
            found[short] = found[full]
    return found
