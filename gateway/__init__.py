"""Gateway: the front door (HTTP API, CLI, process supervisor)."""
