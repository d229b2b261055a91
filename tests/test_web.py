"""The web page of ``slimrag serve`` in a real browser: Debian's ``chromium`` driven by Playwright
(``executable_path``, no browser download) against a real uvicorn on 127.0.0.1 over a real index.

The language model is the deterministic test server (tests/openai_server.py) with a delay between
streamed words, so the answer's text is known in advance and the page can be seen mid-stream.
Ground truth comes from the index itself (`Index.passage`, `Index.search`, `Index.status`) and
from the server's ``/metrics`` (the tokens the page shows). The server has an API key, so the
page must ask for it.

Without chromium or Playwright, the browser tests skip and say what to install; the HTTP checks
of the page's routes still run. ``SLIMRAG_SCREENSHOTS=1 pytest -m slow tests/test_web.py`` runs the
screenshot test: the real local SmolLM2 answers, and the page is saved to docs/screenshots/ for
the README.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_server import assert_error, running
from conftest import DOCS, make_pdf, write_tree
from openai_server import OpenAIServer

from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.evidence import rank_sentences
from slimrag.rag.pipeline import RAG
from slimrag.serve.app import create_app

KEY = "web-key"
CAT_Q = "What is the office cat called?"
TIMEOUT_MS = 20_000
SHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
CHROMIUM = shutil.which("chromium")

#: A document long enough for several chunks, so a passage has neighbours on both sides.
LIGHTHOUSE = "\n\n".join((
    '# The Harbour Light',
    ('The harbour light stands on the granite point north of the old fishing village. It was built in 1871'
     ' by the county, after two schooners were wrecked on the reef in a single winter storm. The tower is '
     'thirty-one metres tall and was painted with red and white bands so that sailors could recognise it '
     'by day.'),
    '## Keepers',
    ('The first keeper, Margaret Ellis, kept the light for twenty-six years. She trimmed the wicks every '
     'four hours, wound the clockwork that turned the lens, and wrote the weather into the log each dawn. '
     'Her log books survive in the village museum and record forty-three rescues.'),
    '## The lens',
    ('In 1904 the oil lamp was replaced by a first-order Fresnel lens made in Paris. The lens floats on a '
     'bath of mercury, so a single keeper can turn several tonnes of glass by hand. Its beam reaches '
     'thirty-seven kilometres on a clear night and flashes white every ten seconds.'),
    '## The foghorn',
    ('A steam foghorn was installed in 1912, after fog hid the light during the loss of the steamer '
     'Albatross. The horn sounds two blasts every minute in fog. Villagers called it the Old Cow, and some'
     ' still complain that it woke them on summer mornings.'),
    '## Today',
    ('The light was automated in 1987 and the last keeper retired the same year. Solar panels now power an'
     " LED lamp, but the Fresnel lens still turns. The keeper's cottage is a museum, open from April to "
     'October, and visitors may climb the one hundred and twelve steps to the gallery.'),
    '## Wrecks on the reef',
    ('Before the light, the reef claimed a ship almost every winter. Divers have charted nine wrecks '
     'within a kilometre of the point; the oldest is a Dutch trader from 1702 whose cargo of blue-glazed '
     'tiles still washes ashore after storms. The schooners Lark and Providence, lost in 1870, lie in '
     'eleven metres of water and are protected as war graves because their crews are buried with them.'),
    '## Birds of the point',
    ('The granite point is a nesting ground for puffins, razorbills and a colony of about four hundred '
     'kittiwakes. Keepers counted the birds each June, so the log books hold one of the longest seabird '
     'records in the country. The puffins return in the second week of April and leave by the middle of '
     'August.'),
    '## Restoration',
    ('In 2009 the tower was stripped to bare stone, repointed with lime mortar and painted again in its '
     'red and white bands. The mercury bath was drained and replaced by roller bearings, because mercury '
     'vapour had made two earlier keepers ill. The work took fourteen months and was paid for by the '
     'village, the county and a public appeal.'),
))

#: One long section: the chunker cuts it in overlapping windows (40 tokens repeated by default).
LOGBOOK = " ".join(f"Day {d}: the keeper logged {d % 7 + 2} ships and wind from the {w}."
                   for d, w in zip(range(1, 61), ["north", "east", "south", "west", "sea"] * 12, strict=True))

try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright
except ImportError:  # the dev extra is not installed
    sync_playwright = None


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    docs = write_tree(tmp_path_factory.mktemp("docs"), {
        **DOCS, "guide/lighthouse.md": LIGHTHOUSE, "notes/logbook.txt": LOGBOOK,
        "papers/telescope.pdf": make_pdf("The telescope was pointed at the Andromeda galaxy.")})
    with Index.build(docs, tmp_path_factory.mktemp("idx") / "web.slimrag", embedder=embedder) as idx:
        yield idx


@pytest.fixture(scope="module")
def echo() -> Iterator[OpenAIServer]:
    with OpenAIServer(chunk_delay_s=0.08) as srv:  # slow enough to see the answer grow
        yield srv


@pytest.fixture(scope="module")
def base(index: Index, echo: OpenAIServer) -> Iterator[str]:
    with running(create_app(RAG(index, echo.base_url), api_key=KEY)) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if sync_playwright is None:
        pytest.skip("the Python package playwright is not installed: pip install -e '.[dev]'")
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH: install Debian's chromium (apt-get install chromium; .ci/run does)")
    expect.set_options(timeout=TIMEOUT_MS)  # assertions wait as long as actions (5 s is short on 2 busy cores)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM)  # Debian's build: no browser download
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    p.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    yield p
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def enter_key(page: Page, key: str) -> None:
    dialog = page.locator("#key-dialog")
    expect(dialog).to_be_visible()
    page.get_by_role("textbox", name="API key").fill(key)
    page.get_by_role("button", name="Use this key").click()


def ask(page: Page, question: str) -> None:
    page.get_by_label("Question").fill(question)
    page.get_by_label("Question").press("Enter")


def metric(base: str, name: str) -> int:
    text = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text
    return int(re.search(rf"^{name} (\d+)$", text, re.M).group(1))


def shoot(page: Page, name: str, full_page: bool = True) -> None:
    if os.environ.get("SLIMRAG_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / name), full_page=full_page)


# -- the browser ---------------------------------------------------------------------------------
def test_ask_stream_cite_search_and_status(page: Page, base: str, index: Index, echo: OpenAIServer) -> None:
    page.goto(base)
    enter_key(page, "not-the-key")  # refused: the page asks again, saying so
    expect(page.locator("#key-why")).to_contain_text("refused")
    enter_key(page, KEY)
    expect(page.locator("#key-dialog")).to_be_hidden()

    status = index.status()
    expect(page.locator("#status-documents")).to_have_text(str(status["documents"]))
    expect(page.locator("#status-chunks")).to_have_text(str(status["chunks"]))
    expect(page.locator("#status-bytes")).to_contain_text("KiB")
    assert page.locator("#status-updated").get_attribute("datetime").startswith("20")

    # the answer streams: text shows while the answer is still busy, then the whole reply
    ask(page, CAT_Q)
    answer = page.locator(".turn").nth(0).locator(".answer")
    page.wait_for_function("""() => { const a = document.querySelector('.turn .answer');
                                      return a.getAttribute('aria-busy') === 'true' && a.textContent.length > 0; }""")
    expect(answer).to_have_attribute("aria-busy", "false")  # screen readers read it once, whole
    expect(answer).to_have_attribute("aria-live", "polite")
    sent = echo.requests_to("/v1/chat/completions")[-1]["body"]
    reply, _ = OpenAIServer.reply(sent["messages"], sent.get("max_tokens"))
    expect(answer).to_have_text(reply)
    usage = page.locator(".turn").nth(0).locator(".usage")
    prompt, cached = metric(base, "slimrag_prompt_tokens_total"), metric(base, "slimrag_cached_tokens_total")
    expect(usage).to_contain_text(f"{prompt} prompt tokens ({cached} cached)")
    expect(usage).to_contain_text(re.compile(r"first token \d+\.\d\d s"))

    # a citation opens its passage: the chunk's text, its document and its neighbours
    cite = page.locator(".turn .sources button.cite").first
    chunk_id = int(cite.get_attribute("data-chunk-id"))
    cite.click()
    excerpt = index.passage(chunk_id)
    expect(page.locator("#passage")).to_be_visible()
    expect(page.locator("#passage-text")).to_have_text(excerpt.chunk.text, use_inner_text=False)
    expect(page.locator("#passage-source")).to_have_text(excerpt.chunk.source)
    expect(page.locator("#passage-body .chunk")).to_have_count(1 + len(excerpt.before) + len(excerpt.after))

    # a follow-up sends the conversation: question, answer, new question
    with page.expect_request("**/v1/chat/completions") as req:
        ask(page, "Where does he sleep?")
    messages = req.value.post_data_json["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[0]["content"] == CAT_Q and messages[1]["content"] == reply
    expect(page.locator(".turn").nth(1).locator(".answer")).to_have_attribute("aria-busy", "false")

    # search, keyword mode: the same hits, in the same order, as the index gives
    page.get_by_label("Search the index").fill("lighthouse keeper lamp")
    page.get_by_label("Mode").select_option("keyword")
    page.get_by_role("button", name="Search", exact=True).click()
    expect(page.locator("#search-summary")).to_contain_text("(keyword)")
    want = [h.chunk_id for h in index.search("lighthouse keeper lamp", k=8, mode="keyword")]
    got = page.locator("#search-results button.cite").evaluate_all("bs => bs.map(b => Number(b.dataset.chunkId))")
    assert got == want and want

    # a PDF hit shows its page, in the list and in the passage
    page.get_by_label("Search the index").fill("Andromeda telescope")
    page.get_by_role("button", name="Search", exact=True).click()
    pdf = page.locator("#search-results li", has_text="papers/telescope.pdf").first
    expect(pdf).to_contain_text("page 1")
    pdf.locator("button.cite").press("Enter")  # the keyboard opens a citation too
    expect(page.locator("#passage-source")).to_have_text("papers/telescope.pdf")
    expect(page.locator("#passage-page")).to_have_text("page 1")

    # a chunk in the middle of a long document shows its neighbours, in reading order
    (hit,) = index.search("foghorn Albatross steamer", k=1, mode="keyword")
    excerpt = index.passage(hit.chunk_id)
    assert excerpt.before and excerpt.after, "the fixture must put the foghorn in a middle chunk"
    page.get_by_label("Search the index").fill("foghorn Albatross steamer")
    page.get_by_role("button", name="Search", exact=True).click()
    page.locator(f"#search-results button.cite[data-chunk-id='{hit.chunk_id}']").click()
    want = [c.chunk_id for c in (*excerpt.before, excerpt.chunk, *excerpt.after)]
    blocks = page.locator("#passage-body .chunk")
    expect(blocks).to_have_count(len(want))
    assert blocks.evaluate_all("bs => bs.map(b => Number(b.dataset.chunkId))") == want
    expect(page.locator("#passage-text")).to_have_text(excerpt.chunk.text, use_inner_text=False)
    expect(page.locator("#passage-body .chunk.before .chunk-text")).to_have_text(
        [c.text for c in excerpt.before], use_inner_text=False)  # merged sections: no overlap

    # overlapping windows of one long section: a neighbour does not repeat what the passage shows
    logbook = [c for c in index.catalog.chunks(index.catalog.live_ids()).values() if c.source == "notes/logbook.txt"]
    middle = sorted(logbook, key=lambda c: c.ordinal)[1]
    excerpt = index.passage(middle.chunk_id)
    page.get_by_label("Search the index").fill(middle.text[:60])
    page.get_by_role("button", name="Search", exact=True).click()
    page.locator(f"#search-results button.cite[data-chunk-id='{middle.chunk_id}']").click()
    expect(page.locator("#passage-text")).to_have_text(middle.text, use_inner_text=False)
    shown_before = page.locator("#passage-body .chunk.before .chunk-text").text_content()
    shown_after = page.locator("#passage-body .chunk.after .chunk-text").text_content()
    (before,), (after,) = excerpt.before, excerpt.after
    assert before.text.startswith(shown_before) and len(shown_before) < len(before.text)
    assert middle.text.startswith(before.text[len(shown_before):])  # what was cut is the passage's start
    assert after.text.endswith(shown_after) and len(shown_after) < len(after.text)
    assert middle.text.endswith(after.text[: len(after.text) - len(shown_after)])


def test_evidence_is_listed_and_highlighted_in_its_passage(page: Page, base: str, index: Index) -> None:
    page.goto(base)
    enter_key(page, KEY)
    ask(page, CAT_Q)
    turn = page.locator(".turn").nth(0)
    expect(turn.locator(".answer")).to_have_attribute("aria-busy", "false")
    # ground truth: the evidence the library ranks for the same question over the same passages
    hits = sorted(index.search(CAT_Q, k=4), key=lambda h: (-h.score, h.chunk_id))
    want = rank_sentences(CAT_Q, hits, index.embedder)
    items = turn.locator("ol.evidence li")
    expect(items).to_have_count(len(want))
    expect(items.locator("q")).to_have_text([e.text for e in want])
    # the best sentence's button opens its passage with that sentence highlighted, the text unchanged
    items.nth(0).locator("button.cite").click()
    expect(page.locator("#passage-text")).to_have_text(index.passage(want[0].chunk_id).chunk.text, use_inner_text=False)
    marks = page.locator("#passage-text mark.evidence")
    expect(marks).to_have_text([e.text for e in want if e.chunk_id == want[0].chunk_id])
    shoot(page, "evidence.png", full_page=False)
    # the same passage opened from a search hit highlights nothing: evidence belongs to an answer
    page.get_by_label("Search the index").fill("office cat Whiskers")
    page.get_by_role("button", name="Search", exact=True).click()
    page.locator(f"#search-results button.cite[data-chunk-id='{want[0].chunk_id}']").click()
    expect(page.locator("#passage-text mark.evidence")).to_have_count(0)
    # sources the answer sentences do not match are listed as "also retrieved"
    also = turn.locator(".sources li.also-retrieved")
    assert also.count() + turn.locator(".sources li:not(.also-retrieved)").count() == len(hits)


def test_every_control_has_a_name(page: Page, base: str) -> None:
    page.goto(base)
    enter_key(page, KEY)
    page.get_by_label("Search the index").fill("cat")
    page.get_by_role("button", name="Search", exact=True).click()
    expect(page.locator("#search-results li").first).to_be_visible()
    unnamed = page.evaluate("""() => [
        ...[...document.querySelectorAll('input, select, textarea')].filter(c => c.labels.length === 0)
            .map(c => c.outerHTML),
        ...[...document.querySelectorAll('button')].filter(b => !b.textContent.trim() && !b.ariaLabel)
            .map(b => b.outerHTML)]""")
    assert unnamed == []
    assert page.locator("html").get_attribute("lang") == "en"


def test_the_key_is_asked_once_per_tab(page: Page, base: str) -> None:
    page.goto(base)
    enter_key(page, KEY)
    expect(page.locator("#status-documents")).not_to_have_text("…")
    page.reload()  # sessionStorage survives a reload of the tab: no dialog this time
    expect(page.locator("#status-documents")).not_to_have_text("…")
    expect(page.locator("#key-dialog")).to_be_hidden()


def test_readable_on_a_phone(browser: Browser, base: str) -> None:
    context = browser.new_context(viewport={"width": 375, "height": 740}, is_mobile=True, has_touch=True)
    try:
        page = context.new_page()
        page.goto(base)
        enter_key(page, KEY)
        expect(page.locator("#status-documents")).not_to_have_text("…")
        # one column, nothing wider than the screen
        assert page.evaluate("document.documentElement.scrollWidth") <= 375
        box_chat, box_search = page.locator("#chat").bounding_box(), page.locator("#search").bounding_box()
        assert box_search["y"] >= box_chat["y"] + box_chat["height"]
    finally:
        context.close()


# -- the page's routes over HTTP (no browser needed) --------------------------------------------
def test_page_files_need_no_key_and_the_api_still_does(base: str) -> None:
    for path, kind in (("/", "text/html"), ("/static/app.js", "text/javascript"), ("/static/style.css", "text/css"),
                       ("/static/markdown.js", "text/javascript"), ("/static/favicon.svg", "image/svg+xml"),
                       ("/favicon.ico", "image/svg+xml")):
        r = httpx.get(base + path, timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert r.headers["x-content-type-options"] == "nosniff"
    head = httpx.head(base + "/", timeout=10)
    assert head.status_code == 200 and head.content == b""
    for path in ("/v1/status", "/v1/passages/0", "/static/index.html", "/static/%2e%2e/static/app.js", "/static/"):
        assert_error(httpx.get(base + path, timeout=10), 401)
    assert_error(httpx.post(base + "/", json={}, timeout=10), 401)  # only GET and HEAD are open


@pytest.fixture
def client(base: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=10) as c:
        yield c


def test_status_and_passage_routes(client: httpx.Client, index: Index) -> None:
    status: dict[str, Any] = client.get("/v1/status").json()
    assert {k: status[k] for k in ("documents", "chunks", "bytes")} == \
        {k: index.status()[k] for k in ("documents", "chunks", "bytes")}
    assert status["search_mode"] in ("vector", "keyword", "hybrid")
    (hit,) = index.search("office cat Whiskers", k=1, mode="keyword")
    p = client.get(f"/v1/passages/{hit.chunk_id}", params={"around": 2}).json()
    ex = index.passage(hit.chunk_id, around=2)
    assert (p["chunk_id"], p["source"], p["text"], p["page"]) == (hit.chunk_id, ex.chunk.source, ex.chunk.text, None)
    assert p["label"] == f"{ex.chunk.source}#{ex.chunk.ordinal}"
    assert [c["chunk_id"] for c in p["before"] + p["after"]] == [c.chunk_id for c in ex.before + ex.after]
    assert_error(client.get("/v1/passages/987654321"), 404, "chunk_id")
    assert_error(client.get(f"/v1/passages/{hit.chunk_id}", params={"around": 99}), 400, "around")
    assert_error(client.get("/v1/passages/-1"), 400, "chunk_id")
    assert_error(client.get(f"/v1/passages/{2**63}"), 400, "chunk_id")
    published = client.get("/openapi.json").json()["paths"]
    assert "/v1/status" in published
    assert "404" in published["/v1/passages/{chunk_id}"]["get"]["responses"]


# -- Markdown answers and hostile text ------------------------------------------------------------
#: A JavaScript function that writes a node tree as nested lists: ["tag", {attrs}, ...children] or "text".
TREE = """(root) => { const walk = (n) => n.nodeType === Node.TEXT_NODE ? n.data
  : [n.tagName.toLowerCase(), Object.fromEntries([...n.attributes].map((a) => [a.name, a.value])),
     ...[...n.childNodes].map(walk)];
  return [...root.childNodes].map(walk); }"""

#: Markdown → the tree the page must build (raw HTML always as text; only http(s) links are links).
MARKDOWN_CASES = [
    ("Plain text.", [["p", {}, "Plain text."]]),
    ("one\ntwo\n\nthree", [["p", {}, "one", ["br", {}], "two"], ["p", {}, "three"]]),
    ("Use `make demo` **now**, *please* ~~later~~.",
     [["p", {}, "Use ", ["code", {}, "make demo"], " ", ["strong", {}, "now"], ", ", ["em", {}, "please"], " ",
       ["del", {}, "later"], "."]]),
    ("```python\nprint('<b>x</b>')\n  indented\n```\nafter",
     [["pre", {}, ["code", {"data-lang": "python"}, "print('<b>x</b>')\n  indented"]], ["p", {}, "after"]]),
    ("```\nstill streaming", [["pre", {}, ["code", {}, "still streaming"]]]),  # an open fence, mid-stream
    ("- a\n- b\n  - b1\n- c", [["ul", {}, ["li", {}, "a"], ["li", {}, "b", ["ul", {}, ["li", {}, "b1"]]],
                                  ["li", {}, "c"]]]),
    ("3. three\n4. four", [["ol", {"start": "3"}, ["li", {}, "three"], ["li", {}, "four"]]]),
    ("# Title\n> quoted *text*\n\n---", [["h3", {}, "Title"], ["blockquote", {}, ["p", {}, "quoted ", ["em", {}, "text"]]],
                                           ["hr", {}]]),
    ("See [the docs](https://example.org/a?b=1) or <https://example.org>.",
     [["p", {}, "See ", ["a", {"href": "https://example.org/a?b=1", "rel": "noopener noreferrer nofollow",
                               "target": "_blank"}, "the docs"],
       " or ", ["a", {"href": "https://example.org/", "rel": "noopener noreferrer nofollow", "target": "_blank"},
                "https://example.org/"], "."]]),
    ("[click](javascript:alert(1)) [data](data:text/html,x) [rel](/v1/status)",
     [["p", {}, "click", " ", "data", " ", "rel"]]),
    ("<img src=x onerror=alert(1)> <script>alert(2)</script>",
     [["p", {}, "<img src=x onerror=alert(1)> <script>alert(2)</script>"]]),
    ("snake_case_name and 2 * 3 * 4 and \\*not em\\*", [["p", {}, "snake_case_name and 2 * 3 * 4 and *not em*"]]),
]


def test_markdown_renderer_builds_nodes_not_html(page: Page, base: str) -> None:
    """markdown.js, as the served page loads it, on each case: the exact node tree."""
    page.goto(base)
    enter_key(page, KEY)
    for text, want in MARKDOWN_CASES:
        got = page.evaluate(f"(text) => ({TREE})(renderMarkdown(text))", text)
        assert got == want, text


#: Text that would run script if any of it were parsed as HTML or followed as a URL.
PAYLOADS = ('<script>window.__pwned = "script"</script>', '<img src=x onerror="window.__pwned=\'img\'">',
            '<svg onload="window.__pwned=\'svg\'"></svg>', '<iframe srcdoc="<script>parent.__pwned=1</script>">')
HOSTILE_DOC = "# Hostile notes\n\nThe parrot passage holds markup: " + " ".join(PAYLOADS) + "\n"
#: A text indented as a page's source often is: shown without the indentation its lines share.
INDENTED_DOC = ("The albatross log, kept by the lighthouse keeper:\n        the albatross landed at noon.\n"
                "            it stayed on the gallery rail.\n        the albatross left at dusk.\n")


@pytest.fixture(scope="module")
def hostile_base(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder,
                 echo: OpenAIServer) -> Iterator[tuple[str, Index]]:
    docs = write_tree(tmp_path_factory.mktemp("hostile"), {"notes/parrot.md": HOSTILE_DOC, "notes/albatross.txt": INDENTED_DOC,
                                                                 **DOCS})
    with Index.build(docs, tmp_path_factory.mktemp("idx") / "hostile.slimrag", embedder=embedder) as idx, \
            running(create_app(RAG(idx, echo.base_url))) as url:
        yield url, idx


def assert_nothing_ran(page: Page, violations: list[str], dialogs: list[str]) -> None:
    assert page.evaluate("window.__pwned") is None and page.evaluate("parent.__pwned") is None
    hostile = ('main img, main script, main svg, main iframe, main [onerror], main [onload], '
               'main a[href^="javascript"], main a[href^="data"]')
    found = page.evaluate("(sel) => [...document.querySelectorAll(sel)].map((n) => n.outerHTML)", hostile)
    assert found == [] and violations == [] and dialogs == []


def test_hostile_text_in_questions_answers_and_passages_never_runs(browser: Browser, hostile_base: tuple[str, Index]) -> None:
    base, index = hostile_base
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    statuses: list[tuple[str, int]] = []
    page.on("response", lambda r: statuses.append((r.url, r.status)))
    page.goto(base)
    page.evaluate("""() => { window.__violations = [];
        document.addEventListener('securitypolicyviolation', (e) => window.__violations.push(e.violatedDirective)); }""")
    try:
        # a question full of payloads: the echo model repeats it in the answer; the passage holds them too
        question = "parrot " + " ".join(PAYLOADS)
        ask(page, question)
        turn = page.locator(".turn").nth(0)
        expect(turn.locator(".answer")).to_have_attribute("aria-busy", "false")
        expect(turn.locator(".question")).to_contain_text(PAYLOADS[0])
        expect(turn.locator(".answer")).to_contain_text("<script>window.__pwned")
        # an answer in Markdown whose text is hostile: fenced, inline, as a link, as raw HTML
        hostile_answer = ("**Bold** answer with [a link](javascript:window.__pwned=3) and " + PAYLOADS[1] + "\n\n"
                          "```html\n" + PAYLOADS[0] + "\n```\n\n- item `" + PAYLOADS[2] + "`\n- " + PAYLOADS[3] + "\n")
        events = [{"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                  for piece in (hostile_answer[:40], hostile_answer[40:])]
        events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                       "slimrag": {"sources": [], "ttft_s": 0.1, "total_s": 0.2}})
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        page.route("**/v1/chat/completions", lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=body))
        ask(page, "Show me the markdown")
        answer = page.locator(".turn").nth(1).locator(".answer")
        expect(answer).to_have_attribute("aria-busy", "false")
        expect(answer.locator("strong")).to_have_text("Bold")
        expect(answer.locator("pre code")).to_have_text(PAYLOADS[0])
        expect(answer.locator("li")).to_have_count(2)
        expect(answer.locator("a")).to_have_count(0)  # a javascript: link is text, not a link
        expect(answer).to_contain_text("a link")

        # the passage and the search snippet show the markup as text
        page.get_by_label("Search the index").fill("parrot passage markup")
        page.get_by_label("Mode").select_option("keyword")
        page.get_by_role("button", name="Search", exact=True).click()
        hit = page.locator("#search-results li", has_text="notes/parrot.md").first
        expect(hit.locator(".snippet")).to_contain_text("<script>")
        hit.locator("button.cite").click()
        expect(page.locator("#passage-text")).to_contain_text(PAYLOADS[1])
        # shown without the source's indentation: the lines' common indent is gone, the relative one kept
        page.get_by_label("Search the index").fill("albatross gallery rail")
        page.get_by_role("button", name="Search", exact=True).click()
        page.locator("#search-results li", has_text="notes/albatross.txt").first.locator("button.cite").click()
        expect(page.locator("#passage-source")).to_have_text("notes/albatross.txt")
        assert page.locator("#passage-text").text_content().strip() == (
            "The albatross log, kept by the lighthouse keeper:\nthe albatross landed at noon.\n"
            "    it stayed on the gallery rail.\nthe albatross left at dusk.")
        page.wait_for_timeout(300)  # any img/onerror would have fired by now
        assert_nothing_ran(page, page.evaluate("window.__violations"), dialogs)
        missing = [(url, status) for url, status in statuses if status >= 400]
        assert missing == []  # the favicon included
    finally:
        context.close()


# -- screenshots with the real local model (SLIMRAG_SCREENSHOTS=1) -------------------------------
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SLIMRAG_SCREENSHOTS") != "1",
                    reason="set SLIMRAG_SCREENSHOTS=1 to save the README's screenshots (runs SmolLM2)")
def test_screenshots_with_the_local_model(browser: Browser, tmp_path: Path, embedder: LocalEmbedder) -> None:
    """Three turns (the second shows the KV cache at work: cached tokens, a warm first token), a
    citation opened, and the page on a phone; each step checked as in the fast test. Its own
    index: the fast test's logbook only adds noise for a 135M model."""
    docs = write_tree(tmp_path / "docs", {
        **DOCS, "guide/lighthouse.md": LIGHTHOUSE,
        "papers/telescope.pdf": make_pdf("The telescope was pointed at the Andromeda galaxy.")})
    index = Index.build(docs, tmp_path / "shots.slimrag", embedder=embedder)
    rag = RAG(index, "local", generation=GenerationConfig(max_new_tokens=40))
    with index, running(create_app(rag)) as url:
        # one answer first, so the page shows a server that has run (the first prefill is slow)
        warm = httpx.post(f"{url}/v1/chat/completions", timeout=300,
                          json={"messages": [{"role": "user", "content": "What is the forecast for Friday?"}]})
        assert warm.status_code == 200, warm.text
        context = browser.new_context(viewport={"width": 1280, "height": 860})
        try:
            page = context.new_page()
            page.goto(url)
            for n, question in enumerate(("What is the office cat called?", "Where does the cat sleep?")):
                ask(page, question)
                answer = page.locator(".turn").nth(n).locator(".answer")
                expect(answer).to_have_attribute("aria-busy", "false", timeout=180_000)
                assert answer.inner_text().strip()
            expect(page.locator(".turn").nth(1).locator(".usage")).to_contain_text(re.compile(r"\([1-9]\d* cached\)"))
            shoot(page, "web-answer.png")
            ask(page, "When was the foghorn installed?")  # cited from the middle of a long document
            expect(page.locator(".turn").nth(2).locator(".answer")).to_have_attribute("aria-busy", "false",
                                                                                      timeout=180_000)
            cite = page.locator(".turn").nth(2).locator(".sources button.cite", has_text="lighthouse.md").first
            chunk_id = int(cite.get_attribute("data-chunk-id"))
            cite.click()
            expect(page.locator("#passage-text")).to_have_text(index.passage(chunk_id).chunk.text,
                                                                use_inner_text=False)
            shoot(page, "web-passage.png", full_page=False)
        finally:
            context.close()
        phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                                    device_scale_factor=2)
        try:
            page = phone.new_page()
            page.goto(url)
            page.get_by_label("Search the index").fill("telescope galaxy")
            page.get_by_role("button", name="Search", exact=True).click()
            expect(page.locator("#search-results li").first).to_be_visible()
            page.locator("#search-results button.cite").first.click()
            expect(page.locator("#passage-text")).to_be_visible()
            shoot(page, "web-phone.png", full_page=False)
        finally:
            phone.close()


def test_the_page_and_its_routes_work_behind_the_router(base: str, client: httpx.Client, index: Index) -> None:
    """``slimrag route`` serves the same page (without the key) and forwards its read-only routes
    to a replica, byte for byte: the page works the same behind the router."""
    from slimrag.route.app import create_router_app
    from slimrag.route.policy import RouterConfig

    chunk = index.search(CAT_Q, k=1, mode="keyword")[0].chunk_id
    with running(create_router_app([base], RouterConfig(health_interval_s=0))) as front, \
            httpx.Client(base_url=front, headers={"Authorization": f"Bearer {KEY}"}, timeout=10) as via:
        page = httpx.get(f"{front}/", timeout=10)
        assert page.status_code == 200 and page.text == client.get("/").text
        assert "content-security-policy" in page.headers
        assert via.get("/v1/status").json() == client.get("/v1/status").json()
        assert via.get(f"/v1/passages/{chunk}?around=1").json() == client.get(f"/v1/passages/{chunk}?around=1").json()
        assert via.get("/v1/passages/999999999").status_code == 404
        assert httpx.get(f"{front}/v1/status", timeout=10).status_code == 401  # the replica's key still holds


def test_page_routes_have_their_own_metrics_series(client: httpx.Client, index: Index) -> None:
    """The page and its routes are counted by route, a passage by its template (one series for
    every id), so /metrics tells the page's traffic from scans ("other")."""
    chunk = index.search(CAT_Q, k=1, mode="keyword")[0].chunk_id
    for path in ("/", "/static/app.js", "/v1/status", f"/v1/passages/{chunk}", "/v1/passages/999999999"):
        client.get(path)
    text = client.get("/metrics").text
    for endpoint, status in (("/", "200"), ("/static/app.js", "200"), ("/v1/status", "200"),
                             ("/v1/passages/{chunk_id}", "200"), ("/v1/passages/{chunk_id}", "404")):
        assert f'slimrag_requests_total{{endpoint="{endpoint}",status="{status}"}}' in text, endpoint
