"""This release's version: the one place it is written (pyproject.toml reads it from here when a wheel is built).

Every process reports it (``pincer --version``, each heartbeat, ``pincer status``, a backup's manifest). Read from
the code rather than from the installed package's metadata, so a source checkout or a stale editable install still
says which code runs (docs/upgrades.md, "Releases").
"""

VERSION = "0.3.0.dev0"
