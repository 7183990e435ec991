"""An eval run's results: kept as JSON (a baseline for the next run), compared with a baseline (every
regression named), and written as JUnit XML for CI (a failed expectation is a ``<failure>``)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brain.evals.checks import Outcome

FORMAT = 1


@dataclass
class Result:
    name: str
    source: str
    mode: str  # offline, live, skipped
    outcome: Outcome = field(default_factory=Outcome)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    skipped: str = ""  # why the case did not run

    @property
    def passed(self) -> bool:
        return not self.failures and not self.skipped

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "mode": self.mode, "passed": self.passed,
                "failures": self.failures, "skipped": self.skipped, "seconds": round(self.seconds, 3),
                "outcome": self.outcome.as_json()}


def save(results: list[Result], path: Path) -> None:
    path.write_text(json.dumps({"pincer_eval": FORMAT, "results": [r.as_json() for r in results]}, indent=2) + "\n")


def load_baseline(path: Path) -> dict[str, dict[str, Any]]:
    """A run saved with ``--save``, by case name (ValueError: what is wrong with the file)."""
    try:
        loaded = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a saved eval run: {exc}") from None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("results"), list):
        raise ValueError(f"{path}: not a saved eval run (`pincer eval PATH --save FILE` writes one)")
    if int(loaded.get("pincer_eval") or 0) > FORMAT:
        raise ValueError(f"{path}: saved by a newer Pincer (format {loaded['pincer_eval']}; this one reads {FORMAT})")
    return {str(r.get("name")): r for r in loaded["results"] if isinstance(r, dict)}


def regressions(results: list[Result], baseline: dict[str, dict[str, Any]], *,
                tolerance: float = 0.1) -> list[str]:
    """Every way this run is worse than the baseline: a case that passed and fails, a different trajectory or
    answer, and tokens, cost or the slowest turn more than ``tolerance`` above it, or the cache hit rate lower
    by more than ``tolerance`` (as a share of the prompt)."""
    found = []
    for result in results:
        before = baseline.get(result.name)
        if before is None or result.skipped:
            continue
        then, now = before.get("outcome") or {}, result.outcome.as_json()
        if before.get("passed") and not result.passed:
            found.append(f"{result.name}: passed in the baseline, fails now: {result.failures[0].splitlines()[0]}")
        if then.get("trajectory") != now["trajectory"]:
            found.append(f"{result.name}: trajectory {then.get('trajectory')} -> {now['trajectory']}")
        if then.get("answer") != now["answer"]:
            found.append(f"{result.name}: the answer changed")
        for key, unit in (("tokens", ""), ("cost_usd", "$"), ("latency_ms", " ms")):
            old, new = float(then.get(key) or 0), float(now[key])
            if new > old * (1 + tolerance) and new - old > 1e-9:
                found.append(f"{result.name}: {key} {_said(old, unit)} -> {_said(new, unit)} "
                             f"(+{(new - old) / old:.0%})" if old else f"{result.name}: {key} 0 -> {_said(new, unit)}")
        hit_then, hit_now = float(then.get("cache_hit") or 0), float(now["cache_hit"])
        if hit_now < hit_then - tolerance:
            found.append(f"{result.name}: cache hit {hit_then:.0%} -> {hit_now:.0%}")
    gone = sorted(set(baseline) - {r.name for r in results})
    found += [f"{name}: in the baseline, not run now" for name in gone]
    return found


def _said(value: float, unit: str) -> str:
    if unit == "$":
        return f"${value:.6f}"
    return f"{value:,.0f}{unit}"


def junit(results: list[Result], path: Path, *, suite: str = "pincer-eval") -> None:
    """JUnit XML: one testcase per case, a ``<failure>`` per failed case listing each missed expectation."""
    failed = sum(1 for r in results if r.failures)
    skipped = sum(1 for r in results if r.skipped)
    total = sum(r.seconds for r in results)
    root = ET.Element("testsuites", name=suite, tests=str(len(results)), failures=str(failed), errors="0",
                      skipped=str(skipped), time=f"{total:.3f}")
    tests = ET.SubElement(root, "testsuite", name=suite, tests=str(len(results)), failures=str(failed), errors="0",
                          skipped=str(skipped), time=f"{total:.3f}")
    for result in results:
        case = ET.SubElement(tests, "testcase", name=result.name, classname=Path(result.source).stem or suite,
                             file=result.source, time=f"{result.seconds:.3f}")
        if result.skipped:
            ET.SubElement(case, "skipped", message=result.skipped)
        elif result.failures:
            failure = ET.SubElement(case, "failure", message=result.failures[0].splitlines()[0][:500],
                                    type="expectation")
            failure.text = "\n".join(result.failures)
        figures = result.outcome.as_json()
        ET.SubElement(case, "system-out").text = json.dumps(
            {key: figures[key] for key in ("trajectory", "tokens", "cost_usd", "cache_hit", "latency_ms")})
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
