"""Main-content extraction of HTML pages: what each extractor keeps and leaves on pages with a real
manual's layout (tests/fixtures/manual, ground truth in its truth.json).

For each extractor and page: content paragraphs kept (whitespace folded), headings kept, code
blocks kept line for line (indentation included), chrome strings left (whole words: "Prev",
"Home", a sidebar's links, a footer's copyright), and milliseconds per page (best of 20).

Extractors: ``whole page`` (slimrag's reader before issue 20: every visible text), ``trafilatura``
(its plain text), ``readability-lxml`` (its summary's text; only when the package is installed,
it is not a slimrag dependency) and ``slimrag`` (`slimrag.ingest.mainhtml.main_sections`:
trafilatura decides, slimrag's parse keeps the structure).

    python -m bench.html_main          # prints a table, writes bench/results/html_main.json
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from slimrag.ingest.html import page_sections
from slimrag.ingest.mainhtml import main_sections, main_text

MANUAL = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "manual"
OUT = Path(__file__).with_name("results") / "html_main.json"


def _whole(html: str) -> str:
    return "\n\n".join(s.text for s in page_sections(html))


def _slimrag(html: str) -> str:
    return "\n\n".join(s.text for s in main_sections(html))


def _trafilatura(html: str) -> str:
    return main_text(html) or ""


def _readability(html: str) -> str:
    import lxml.html
    from readability import Document

    return lxml.html.fromstring(Document(html).summary(html_partial=True)).text_content()


def extractors() -> dict[str, Callable[[str], str]]:
    found: dict[str, Callable[[str], str]] = {"whole page": _whole, "trafilatura": _trafilatura}
    try:
        import readability  # noqa: F401
    except ImportError:
        print("readability-lxml is not installed: pip install readability-lxml to compare it")
    else:
        found["readability-lxml"] = _readability
    found["slimrag"] = _slimrag
    return found


def fold(text: str) -> str:
    return " ".join(text.split())


def score(text: str, truth: dict[str, list[str]]) -> dict[str, object]:
    flat = fold(text)
    return {
        "paragraphs": sum(p in flat for p in truth["paragraphs"]),
        "headings": sum(h in flat for h in truth["headings"]),
        "code": sum(all(line in text for line in c.split("\n")) for c in truth["code"]),
        "chrome_left": [c for c in truth["chrome"] if re.search(rf"(?<!\w){re.escape(c)}(?!\w)", flat)],
    }


def main() -> None:
    truth = {k: v for k, v in json.loads((MANUAL / "truth.json").read_text()).items() if not k.startswith("_")}
    rows = []
    for name, fn in extractors().items():
        for page, t in truth.items():
            html = (MANUAL / page).read_text()
            best = float("inf")
            for _ in range(20):
                t0 = time.perf_counter()
                text = fn(html)
                best = min(best, time.perf_counter() - t0)
            rows.append({"extractor": name, "page": page, **score(text, t), "ms": round(best * 1000, 2),
                         "of": {k: len(t[k]) for k in ("paragraphs", "headings", "code", "chrome")}})
    print(f"{'extractor':18} {'page':24} {'paragraphs':>10} {'headings':>8} {'code':>5} {'chrome':>7} {'ms':>7}")
    for r in rows:
        of = r["of"]
        print(f"{r['extractor']:18} {r['page']:24} {r['paragraphs']:>5}/{of['paragraphs']:<4} "
              f"{r['headings']:>4}/{of['headings']:<3} {r['code']:>2}/{of['code']:<2} "
              f"{len(r['chrome_left']):>3}/{of['chrome']:<3} {r['ms']:>7.2f}")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(rows, indent=1))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
