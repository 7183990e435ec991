"""Allowlist matching: every segment must run an allowed program; shell tricks never match."""

from __future__ import annotations

import pytest

from hands.approvals import matches, segments
from hands.config import AllowEntry

ALLOW = [AllowEntry(path="/usr/bin/ls"), AllowEntry(path="/usr/bin/wc"),
         AllowEntry(path="/usr/bin/git", args=r"(status|log)( .*)?")]


def allowed(command: str) -> bool:
    return all(matches(s, ALLOW) for s in segments(command, None))


@pytest.mark.parametrize("command", ["ls", "ls -la /workspace | wc -l", "/bin/ls; ls && wc x || ls &",
                                     "git status", "git log --oneline"])
def test_allowed_commands(command: str) -> None:
    assert allowed(command)


@pytest.mark.parametrize(("command", "problem"), [
    ("ls | sh", None),
    ("git push", None),
    ("ls > /etc/passwd", "redirections"),
    ("wc < secret", "redirections"),
    ("ls $(rm -rf /)", "command substitution"),
    ("ls `id`", "command substitution"),
    ("(ls)", "subshells"),
    ("$SHELL -c id", "only known when it runs"),
    ("FOO=1 ls", "only known when it runs"),
    ("nosuchprogram", "not found"),
    ("ls 'unclosed", "does not parse"),
])
def test_refused_commands(command: str, problem: str | None) -> None:
    assert not allowed(command)
    if problem:
        assert any(problem in (s.problem or "") for s in segments(command, None))


def test_argv_is_one_segment_resolved_through_links() -> None:
    (segment,) = segments(None, ["ls", "-l"])
    assert segment.path == "/usr/bin/ls" and segment.args == ["-l"]
    assert matches(segment, ALLOW)
