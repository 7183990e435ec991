"""Eval cases: YAML files holding one case or a list, shaped so cases can be shared.

    name: reads a file twice
    conversation:            # or  session: recordings/reads.jsonl  (a `pincer record export` file)
      - user: read a.txt twice
    expect:
      trajectory: [read_file, read_file]
      trajectory_match: strict    # unordered, subset (no call outside these), superset (these at least)
      answer_contains: alpha      # or a list: each must be in the answer
      answer_regex: "a\\.txt says"
      max_tokens: 2000            # prompt and completion, all model calls of the case
      max_cost_usd: 0.01
      min_cache_hit: 0.5          # cached prompt tokens / prompt tokens
      max_latency_ms: 30000       # the slowest turn, message to answer
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bus.errors import PincerError

Match = Literal["strict", "unordered", "subset", "superset"]


class CaseError(PincerError):
    """A case file that cannot be used: names the file, the case and the field, and what is wrong."""


class UserTurn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str = Field(min_length=1)


class Expect(BaseModel):
    model_config = ConfigDict(extra="forbid")
    trajectory: list[str] | None = None
    trajectory_match: Match = "strict"
    answer_contains: list[str] = Field(default_factory=list)
    answer_regex: str | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    max_cost_usd: float | None = Field(default=None, ge=0)
    min_cache_hit: float | None = Field(default=None, ge=0, le=1)
    max_latency_ms: float | None = Field(default=None, ge=0)

    @field_validator("answer_contains", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("answer_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    conversation: list[UserTurn] | None = Field(default=None, min_length=1)
    session: Path | None = None  # a recording; relative to the case's file
    agent: str = "main"
    sender: str = "eval"  # whose turn it is live: its tool policy and workspace (a recording keeps its own)
    expect: Expect = Field(default_factory=Expect)
    source: str = ""  # the file it came from (set by the loader)

    @model_validator(mode="after")
    def _one_conversation(self) -> Case:
        if (self.conversation is None) == (self.session is None):
            raise ValueError("give either `conversation` (a list of {user: TEXT}) or `session` (a recording "
                             "from `pincer record export`), not both or neither")
        return self


def load_cases(path: Path) -> list[Case]:
    """Every case in ``path``: a YAML file, or each ``*.yaml``/``*.yml`` under a directory in name order."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
        if not files:
            raise CaseError(f"{path}: no case files (*.yaml, *.yml) in it")
    elif path.is_file():
        files = [path]
    else:
        raise CaseError(f"{path}: no such file or directory")
    cases = [case for file in files for case in _cases_in(file)]
    seen: dict[str, str] = {}
    for case in cases:
        if case.name in seen:
            raise CaseError(f"{case.source}: a case named {case.name!r} is already in {seen[case.name]} "
                            "(names identify cases in reports and baselines: make them unique)")
        seen[case.name] = case.source
    return cases


def _cases_in(file: Path) -> list[Case]:
    try:
        loaded = yaml.safe_load(file.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise CaseError(f"{file}: cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        raise CaseError(f"{file}: not YAML: {exc}") from None
    items = loaded if isinstance(loaded, list) else [loaded]
    cases = []
    for number, item in enumerate(items, 1):
        where = f"{file}" + (f", case {number}" if isinstance(loaded, list) else "")
        if not isinstance(item, dict):
            raise CaseError(f"{where}: a case is a mapping with `name`, `conversation` or `session`, and `expect`")
        try:
            case = Case.model_validate({**item, "source": str(file)})
        except ValidationError as exc:
            raise CaseError(f"{where}: {_said(exc)}") from None
        if case.session is not None and not case.session.is_absolute():
            case.session = file.parent / case.session
        cases.append(case)
    return cases


def _said(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in error['loc']) or 'the case'}: {error['msg']}"
                     for error in exc.errors())
