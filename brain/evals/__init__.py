"""Evals: cases in YAML, run offline against recordings (a replay) or live against a model, each
outcome checked against what the case expects; a table, JUnit XML, and a comparison with a baseline.

- ``cases``: the file format, loaded with errors that name the file and the field;
- ``checks``: an outcome and what a case expects of it;
- ``run``: one case run offline (its recording replayed) or live (its messages to the model);
- ``report``: results saved and compared with a baseline, and written as JUnit XML.
"""
