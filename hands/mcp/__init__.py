"""MCP servers as tool sources: each configured server's tools join the registry as ``mcp_<server>_<tool>``."""
