"""The skills shipped with Pincer, one folder each (SKILL.md, and handler.py for a tool skill).

A package only so that an installed Pincer finds them (``importlib.resources``); nothing imports it.
"""
