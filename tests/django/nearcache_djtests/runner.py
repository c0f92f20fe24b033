"""A ``DiscoverRunner`` that writes every test outcome to a JSON file.

Django's runner prints unittest's summary; ``tests/django/run.py`` needs the
outcome of each test (to count how many ran against nearcache's backends and to
show failures compactly), so the result class records them and the runner
writes them to the path in ``NEARCACHE_DJTESTS_RESULTS`` when the run ends.
"""

from __future__ import annotations

import json
import os
import unittest
from types import TracebackType
from typing import Any

from django.test.runner import DiscoverRunner

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType]

# When one test reports several outcomes (subtests), the highest rank wins.
_RANK = {
    "success": 0,
    "skip": 1,
    "expected_failure": 2,
    "unexpected_success": 3,
    "failure": 4,
    "error": 5,
}


def _test_id(test: unittest.TestCase) -> str:
    """Return ``module.Class.method`` for a test, without subtest parameters."""
    return f"{type(test).__module__}.{type(test).__qualname__}.{test._testMethodName}"


class RecordingResult(unittest.TextTestResult):
    """A text result that also keeps one outcome per test.

    A test with failing subtests is recorded once, as failed, with every
    failure's traceback.
    """

    outcomes: dict[str, dict[str, Any]] = {}

    def _record(self, test: unittest.TestCase, outcome: str, detail: str = "") -> None:
        entry = self.outcomes.setdefault(_test_id(test), {"outcome": outcome, "details": []})
        if _RANK[outcome] > _RANK[entry["outcome"]]:
            entry["outcome"] = outcome
        if detail:
            entry["details"].append(detail)

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._record(test, "success")

    def addFailure(self, test: unittest.TestCase, err: _ExcInfo) -> None:
        super().addFailure(test, err)
        self._record(test, "failure", self._exc_info_to_string(err, test))

    def addError(self, test: unittest.TestCase, err: _ExcInfo) -> None:
        super().addError(test, err)
        if isinstance(test, unittest.TestCase):
            self._record(test, "error", self._exc_info_to_string(err, test))
        else:  # an error in setUpClass/setUpModule: unittest passes a placeholder
            entry = self.outcomes.setdefault(str(test), {"outcome": "error", "details": []})
            entry["details"].append(self._exc_info_to_string(err, test))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self._record(test, "skip", reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: _ExcInfo) -> None:
        super().addExpectedFailure(test, err)
        self._record(test, "expected_failure")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self._record(test, "unexpected_success")

    def addSubTest(
        self,
        test: unittest.TestCase,
        subtest: unittest.TestCase,
        err: _ExcInfo | None,
    ) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            kind = "failure" if issubclass(err[0], test.failureException) else "error"
            self._record(test, kind, f"{subtest}\n{self._exc_info_to_string(err, test)}")


class RecordingRunner(DiscoverRunner):
    """Django's discover runner, recording outcomes with :class:`RecordingResult`."""

    def get_resultclass(self) -> Any:
        """Use the recording result unless a debugging option asks for another."""
        return super().get_resultclass() or RecordingResult

    def run_suite(self, suite: unittest.TestSuite, **kwargs: Any) -> unittest.TestResult:
        """Run the suite, then write the recorded outcomes as JSON."""
        RecordingResult.outcomes = {}
        result = super().run_suite(suite, **kwargs)
        path = os.environ.get("NEARCACHE_DJTESTS_RESULTS")
        if path:
            with open(path, "w", encoding="utf-8") as out:
                json.dump(
                    {"testsRun": result.testsRun, "tests": RecordingResult.outcomes},
                    out,
                    indent=1,
                    sort_keys=True,
                )
        return result
