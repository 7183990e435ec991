"""Tool arguments against their schema: the Rust check decides, the Python validator explains."""

from hands.registry import ArgsValidator

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer", "minimum": 1}},
          "required": ["path"], "additionalProperties": False}


def test_valid_arguments_have_no_errors() -> None:
    validator = ArgsValidator(SCHEMA)
    assert validator.fast is not None
    assert validator.errors({"path": "a.txt", "n": 2}) == []


def test_invalid_arguments_are_explained_one_line_per_path_in_python_wording() -> None:
    lines = ArgsValidator(SCHEMA).errors({"path": 5, "n": 0, "colour": "red"})
    assert lines == ["(arguments): Additional properties are not allowed ('colour' was unexpected)",
                     "n: 0 is less than the minimum of 1", "path: 5 is not of type 'string'"]


def test_a_schema_only_python_compiles_is_still_enforced() -> None:
    # `\Z` is Python regex syntax the Rust validator refuses: the Python validator does the whole job.
    validator = ArgsValidator({"type": "object", "properties": {"word": {"type": "string", "pattern": "^a+\\Z"}}})
    assert validator.fast is None
    assert validator.errors({"word": "aaa"}) == []
    assert validator.errors({"word": "ab"}) == ["word: 'ab' does not match '^a+\\\\Z'"]


def test_keys_json_cannot_hold_are_judged_by_python_not_crashed_on() -> None:
    validator = ArgsValidator({"type": "object"})
    assert validator.errors({1: "x"}) == []  # type: ignore[dict-item]
    assert ArgsValidator({"type": "object", "additionalProperties": False}).errors({1: "x"})  # type: ignore[dict-item]
