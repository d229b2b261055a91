"""The web page chooses the answer mode (issue 29: ``--answer free|grounded`` everywhere): its
"Answer" select sends the request's ``answer`` field, or none for the server's default, and the
turn says which mode answered. The browser, server and index of tests/test_web.py (Debian's chromium,
a real uvicorn, the deterministic test model); skipped with them when no browser is installed."""

from __future__ import annotations

from typing import Any

import pytest
from test_web import KEY, ask, enter_key
from test_web import base as base  # noqa: F401  (the fixtures, shared with the page's other tests)
from test_web import browser as browser  # noqa: F401
from test_web import echo as echo  # noqa: F401
from test_web import index as index  # noqa: F401
from test_web import page as page  # noqa: F401

QUESTION = "Who kept the harbour light first?"
expect = pytest.importorskip("playwright.sync_api", reason="the dev extra (playwright) is not installed").expect


def test_the_answer_select_sends_the_mode_and_the_turn_names_it(page: Any, base: str) -> None:  # noqa: F811
    page.goto(base)
    enter_key(page, KEY)
    mode = page.get_by_label("Answer", exact=True)
    expect(mode).to_have_value("")  # the server's default: the request names no mode
    for i, (choice, shown) in enumerate([("", "free"), ("grounded", "grounded"), ("free", "free")]):
        mode.select_option(choice)
        with page.expect_request("**/v1/chat/completions") as sent:
            ask(page, QUESTION)
        assert sent.value.post_data_json.get("answer") == (choice or None)
        usage = page.locator(".turn").nth(i).locator(".usage")
        expect(usage).to_contain_text(f"{shown} answer")  # a remote model's default is free
