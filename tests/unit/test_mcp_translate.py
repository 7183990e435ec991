"""What Pincer takes from an MCP server's answers, and the shape of a server's entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mcp import types
from pydantic import ValidationError

from bus.config import ConfigError
from bus.protocol import ErrorCode
from hands.config import HandsSettings, McpServerSettings
from hands.errors import ToolFailure
from hands.mcp.servers import configured_tool
from hands.mcp.translate import ToolRefused, parameters, result_data, screen_tool_list, tool_name
from hands.mcp.transport import expand
from tests.conftest import ROOT


def test_tool_names_are_what_every_provider_accepts() -> None:
    assert tool_name("git", "git_status") == "mcp_git_git_status"
    assert tool_name("fs", "read file/../x") == "mcp_fs_read_file_x"
    long = tool_name("server", "t" * 200)
    assert len(long) == 64 and long != tool_name("server", "t" * 199)  # a hash keeps long names apart


def test_a_schema_is_normalised_or_refused() -> None:
    bare = parameters(types.Tool(name="t", input_schema={"type": "object"}))
    assert bare == {"type": "object", "properties": {}}
    drafted = parameters(
        types.Tool(
            name="t",
            input_schema={
                "$schema": "http://json-schema.org/draft-07/schema#",
                "type": "object",
                "properties": {"a": {"type": "string"}},
            },
        )
    )
    assert "$schema" not in drafted and drafted["properties"] == {"a": {"type": "string"}}
    with pytest.raises(ToolRefused, match="not valid JSON Schema"):
        parameters(types.Tool(name="t", input_schema={"type": "object", "properties": {"a": {"type": 7}}}))
    with pytest.raises(ToolRefused, match="over 32,000 bytes"):
        parameters(types.Tool(name="t", input_schema={"type": "object", "description": "x" * 40_000}))


def test_bad_list_entries_are_dropped_with_a_reason_and_the_rest_kept() -> None:
    answer = types.JSONRPCResponse(jsonrpc="2.0", id=1, result={"tools": [
        {"name": "good", "inputSchema": {"type": "object"}},
        {"name": "worse", "inputSchema": "not a schema"},
        {"inputSchema": {"type": "object"}},
        {"name": "arr", "inputSchema": {"type": "array"}},
    ]})
    refused: list[str] = []
    screen_tool_list(answer, refused.append)
    assert [t["name"] for t in answer.result["tools"]] == ["good"]
    assert refused[0].startswith("worse: not an MCP tool") and refused[1] == "(unnamed): it has no name"
    assert refused[2].startswith("arr: its inputSchema has type 'array'")


def test_results_become_readable_data_and_is_error_a_failure() -> None:
    data = result_data("s", types.CallToolResult(content=[
        types.TextContent(type="text", text="one"), types.TextContent(type="text", text="two"),
        types.ImageContent(type="image", data="AAAA", mime_type="image/png"),
        types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
            uri="file:///b", blob="AAAAAAAA", mime_type="application/zip")),
    ], structured_content={"n": 1}))
    assert data["text"] == "one\ntwo" and data["structured"] == {"n": 1}
    assert data["attachments"][0] == {"type": "image", "mime_type": "image/png", "bytes": 3,
                                      "note": "a image (image/png) the model cannot see yet"}
    assert data["attachments"][1]["bytes"] == 6 and data["attachments"][1]["note"] == "binary content, not shown"
    with pytest.raises(ToolFailure) as failed:
        result_data("s", types.CallToolResult(content=[types.TextContent(type="text", text="no such repo")],
                                              is_error=True))
    assert failed.value.code is ErrorCode.TOOL_ERROR and "no such repo" in failed.value.message


def test_an_entry_is_one_transport_with_a_usable_name() -> None:
    with pytest.raises(ValidationError, match="either command"):
        McpServerSettings(command="x", url="http://h/mcp")
    with pytest.raises(ValidationError, match="either command"):
        McpServerSettings()
    with pytest.raises(ValidationError, match="must start with http"):
        McpServerSettings(url="file:///etc/passwd")
    with pytest.raises(ValidationError, match="MCP server name 'a b'"):
        HandsSettings.model_validate({"mcp": {"servers": {"a b": {"command": "x"}}}})


def test_secrets_are_references_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PINCER_TEST_TOKEN", "s3cret")
    assert expand("gh", "env", {"TOKEN": "${PINCER_TEST_TOKEN}", "MODE": "ro"}) == {"TOKEN": "s3cret", "MODE": "ro"}
    monkeypatch.delenv("PINCER_TEST_TOKEN")
    with pytest.raises(ConfigError, match=r"hands.mcp.servers.gh.env.TOKEN names \$\{PINCER_TEST_TOKEN\}, "
                                          r"but PINCER_TEST_TOKEN is not set in the environment of the Hands worker"):
        expand("gh", "env", {"TOKEN": "${PINCER_TEST_TOKEN}"})


def test_policy_explain_knows_a_configured_servers_tools(tmp_path) -> None:
    settings = HandsSettings.model_validate({"mcp": {"servers": {"git": {"command": "x", "category": "code"}}}})
    tool = configured_tool(settings.mcp, "mcp_git_status")
    assert tool is not None and tool.category.key == "code" and configured_tool(settings.mcp, "mcp_other_x") is None
    env = {**os.environ, "PINCER_HANDS__MCP__SERVERS": json.dumps({"git": {"command": "x", "category": "code"}}),
           "PINCER_HANDS__TOOLS__DENY": "[group:runtime]", "PINCER_DATA_DIR": str(tmp_path)}
    shown = subprocess.run([sys.executable, "-m", "gateway", "policy", "explain", "mcp_git_status"], env=env,
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    assert "mcp_git_status (code_execution)" in shown.stdout and "DENIED" in shown.stdout
