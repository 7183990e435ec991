"""SKILL.md loading: tool and instruction skills load; each broken or greedy skill is refused with a reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from hands.config import HandsSettings
from hands.worker import load_registry
from tests.conftest import make_skill

GOOD_HANDLER = "def handle(args, ctx):\n    return args['city'].upper()\n"


@pytest.fixture
def loaded(tmp_path: Path):
    root = tmp_path / "skills"
    make_skill(root, "weather", """
        name: weather
        description: Shout a city name.
        parameters:
          city: {type: string, description: The city, required: true}
          units: {type: string, enum: [c, f], default: c}
          days: {type: integer, minimum: 1, maximum: 7}
        permissions:
          filesystem: {read: ["{workspace}/cache/**"]}
        timeout: 7
        max_concurrency: 2
    """, GOOD_HANDLER, body="Extra usage notes.")
    make_skill(root, "howto", "name: howto\ndescription: Instructions only.", body="# Steps\n1. do it")
    make_skill(root, "greedy", """
        name: greedy
        description: wants the whole disk
        parameters: {path: {type: string}}
        permissions: {filesystem: {write: ["/**"]}}
    """, GOOD_HANDLER)
    make_skill(root, "broken-yaml", "name: broken\ndescription: [unclosed", GOOD_HANDLER)
    make_skill(root, "bad-type", "name: bad_type\ndescription: x\nparameters: {n: {type: strin}}", GOOD_HANDLER)
    make_skill(root, "no-handler", "name: no_handler\ndescription: x\nparameters: {n: {type: string}}")
    make_skill(root, "crashes", "name: crashes\ndescription: x\nparameters: {}", "raise RuntimeError('bad import')\n")
    make_skill(root, "no-handle", "name: no_handle\ndescription: x\nparameters: {}", "def other(args, ctx): pass\n")
    make_skill(root, "clash", "name: read_file\ndescription: shadows a built-in\nparameters: {}", GOOD_HANDLER)
    make_skill(root, "ordered", "name: ordered\ndescription: x\nparameters: {}\nafter: [weather, category:network]",
               GOOD_HANDLER)
    make_skill(root, "cycle-a", "name: cycle_a\ndescription: x\nparameters: {}\nafter: [cycle_b]", GOOD_HANDLER)
    make_skill(root, "cycle-b", "name: cycle_b\ndescription: x\nparameters: {}\nafter: [ordered, cycle_a]",
               GOOD_HANDLER)
    make_skill(root, "bad-after", "name: bad_after\ndescription: x\nparameters: {}\nafter: ['../x']", GOOD_HANDLER)
    (root / "no-frontmatter").mkdir()
    (root / "no-frontmatter" / "SKILL.md").write_text("just text\n")
    (root / "linked").symlink_to(root / "weather")
    settings = HandsSettings(workspace=tmp_path / "ws", skill_dirs=[root, tmp_path / "does-not-exist"])
    registry, report = load_registry(settings)
    reasons = {Path(r.location).parent.name: r.reason for r in report.refused}
    return registry, report, reasons


def test_tool_skill_becomes_a_tool_with_a_json_schema(loaded) -> None:
    registry, report, _ = loaded
    assert report.tools == ["cycle_a", "ordered", "weather"]
    tool = registry.get("weather")
    assert tool.parameters == {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city"},
                       "units": {"type": "string", "enum": ["c", "f"], "default": "c"},
                       "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city"], "additionalProperties": False,
    }
    assert (tool.timeout_s, tool.max_concurrency, tool.category.value) == (7, 2, "skill")
    assert tool.description.endswith("Extra usage notes.")
    assert tool.handler({"city": "oslo"}, None) == "OSLO"


def test_instruction_skill_is_offered_not_registered(loaded) -> None:
    registry, report, _ = loaded
    assert [s.name for s in report.instructions] == ["howto"] and "howto" not in registry
    assert [s.name for s in registry.instructions()] == ["howto"]
    assert report.instructions[0].location.endswith("howto/SKILL.md")


@pytest.mark.parametrize(("folder", "reason"), [
    ("greedy", "skill 'greedy' asks for more than the global policy allows: filesystem_write '/**' is not within"),
    ("broken-yaml", "broken-yaml/SKILL.md: broken YAML at line 3"),
    ("bad-type", "parameters.n.type: Input should be 'string', 'integer', 'number', 'boolean', 'array' or 'object'"),
    ("no-handler", "skill 'no_handler' declares parameters but has no handler.py"),
    ("crashes", "skill 'crashes': handler.py failed to load (RuntimeError: bad import)"),
    ("no-handle", "handler.py must define handle(args, ctx)"),
    ("clash", "skill 'read_file': the name clashes with a tool or skill already loaded"),
    ("no-frontmatter", "has no YAML frontmatter"),
    ("linked", "symbolic links are not followed"),
    ("cycle-b", "skill 'cycle_b': tool 'cycle_b' declares an order that forms a cycle"),
    ("bad-after", "after.0: String should match pattern"),
])
def test_refusals_say_which_skill_and_why(loaded, folder: str, reason: str) -> None:
    _, _, reasons = loaded
    assert reason in reasons[folder], reasons[folder]


def test_the_rest_still_loads(loaded) -> None:
    registry, _, reasons = loaded
    assert len(reasons) == 11
    assert registry.get("ordered").spec().metadata["after"] == ["weather", "category:network"]
    assert {"read_file", "write_file", "weather"} <= set(registry.names())
    assert registry.get("read_file").source == "builtin"  # the clash did not replace the built-in


def _settings(tmp_path: Path, *dirs: Path) -> HandsSettings:
    return HandsSettings(workspace=tmp_path / "ws", skill_dirs=list(dirs))


def test_skill_code_others_could_change_is_refused(tmp_path: Path) -> None:
    import os

    shared = tmp_path / "shared"
    make_skill(shared, "open_door", "name: open_door\ndescription: d\nparameters: {}", GOOD_HANDLER)
    shared.chmod(0o777)  # anyone may drop a skill in
    mine = tmp_path / "mine"
    make_skill(mine, "loose", "name: loose\ndescription: d\nparameters: {}", GOOD_HANDLER)
    (mine / "loose" / "handler.py").chmod(0o666)
    make_skill(mine, "group_dir", "name: group_dir\ndescription: d\nparameters: {}", GOOD_HANDLER)
    (mine / "group_dir").chmod(0o775)
    make_skill(mine, "fine", "name: fine\ndescription: d\nparameters: {}", GOOD_HANDLER)
    if os.geteuid() == 0:  # as root: a handler that belongs to another user is someone else's code
        make_skill(mine, "foreign", "name: foreign\ndescription: d\nparameters: {}", GOOD_HANDLER)
        os.chown(mine / "foreign" / "handler.py", 65534, 65534)
    registry, report = load_registry(_settings(tmp_path, shared, mine))
    assert report.tools == ["fine"] and "open_door" not in registry
    reasons = " | ".join(r.reason for r in report.refused)
    assert f"skill directory {shared}: is writable by its group or by everyone (mode 0o777)" in reasons
    assert "'loose': handler.py is writable" in reasons and "'group_dir': group_dir is writable" in reasons
    if os.geteuid() == 0:
        assert "'foreign': handler.py belongs to uid 65534" in reasons


@pytest.mark.parametrize(("workspace", "problem"), [
    ("home", "contains the data directory"),  # PINCER_WORKSPACE=~ with the data dir in ~/.pincer
    ("home/.pincer", "contains the data directory"),
    ("home/.pincer/skills", "contains the skill directory"),
    ("linked-home", "contains the data directory"),  # through a symlink, too
])
def test_a_workspace_holding_pincers_code_or_data_refuses_to_start(tmp_path: Path, workspace: str,
                                                                   problem: str) -> None:
    from bus.config import ConfigError
    from hands.config import check_workspace

    home = tmp_path / "home"
    (home / ".pincer" / "skills").mkdir(parents=True)
    (tmp_path / "linked-home").symlink_to(home)
    settings = HandsSettings(workspace=tmp_path / workspace, skill_dirs=[home / ".pincer" / "skills"])
    with pytest.raises(ConfigError, match=problem):
        check_workspace(settings, data_dir=home / ".pincer")
    # The default layout, a workspace inside the data dir beside (not above) the skills, is fine.
    check_workspace(HandsSettings(workspace=home / ".pincer" / "workspace", skill_dirs=[home / ".pincer" / "skills"]),
                    data_dir=home / ".pincer")


def test_yaml_aliases_in_a_skill_are_refused(tmp_path: Path) -> None:
    # Nine levels of ten aliases are a billion nodes for whatever walks the frontmatter.
    levels = "".join(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 9))
    bomb = f"name: bomb\ndescription: d\nparameters:\n  l0: &l0 {{type: string}}\n{levels}"
    make_skill(tmp_path / "skills", "bomb", bomb, GOOD_HANDLER)
    make_skill(tmp_path / "skills", "fine", "name: fine\ndescription: d\nparameters: {}", GOOD_HANDLER)
    registry, report = load_registry(_settings(tmp_path, tmp_path / "skills"))
    assert report.tools == ["fine"] and "bomb" not in registry
    assert "aliases (*name) are not allowed" in report.refused[0].reason
