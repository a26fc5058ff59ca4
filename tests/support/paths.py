"""The repository's folders, for the tests: no test computes a path from its own ``__file__``,
so a test file can move between the suite's folders without a change."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
# scripts run by a reference environment's own Python (vLLM 0.34.0, SGLang), by path
REFERENCE = TESTS / "support" / "reference"
