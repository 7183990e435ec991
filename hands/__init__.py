"""Hands: the tool execution engine. Validate, limit, execute, shape, answer."""
