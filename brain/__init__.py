"""Brain: the LLM tool-calling loop."""
