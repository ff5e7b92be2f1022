"""The browser stage's gate: without Chromium it skips on a laptop and fails in CI, never passes."""

from __future__ import annotations

import pytest

from course import sitebrowser


@pytest.fixture
def no_chromium(monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.setenv("COURSE_CHROMIUM", str(tmp_path / "no-such-chrome"))
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("COURSE_STRICT", raising=False)
    assert sitebrowser.find_chromium() is None


def test_a_missing_browser_skips_with_its_reason_on_a_laptop(no_chromium):
    with pytest.raises(pytest.skip.Exception, match="no Chromium found"):
        sitebrowser.unavailable("no Chromium found (apt-get install chromium)")


@pytest.mark.parametrize("name", ["CI", "COURSE_STRICT"])
def test_a_missing_browser_fails_in_ci(no_chromium, monkeypatch: pytest.MonkeyPatch, name: str):
    monkeypatch.setenv(name, "true" if name == "CI" else "1")
    with pytest.raises(pytest.fail.Exception, match="browser test cannot run in CI: no Chromium"):
        sitebrowser.unavailable("no Chromium found")


def test_the_browser_checks_stay_out_of_the_cpu_suite():
    assert not sitebrowser.__file__.rsplit("/", 1)[-1].startswith("test_"), (
        "the browser test runs in its own CI stage, not inside the 60 s suite"
    )
