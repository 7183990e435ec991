"""Sandboxed execution of commands: tier detection, isolation, limits, bounded output, tree kill."""
