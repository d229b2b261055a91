"""Real text for the benchmarks, fetched from the package registries and cached in bench/data/.

- Python documentation sources: Debian's ``python3.11-doc`` (``apt-get download`` + ``dpkg -x``),
  the reST sources under ``html/_sources``, split into paragraphs of at least 8 words.
- disfl_qa: question → passage pairs from the ``bigbench==1.0.0`` source archive on PyPI; each
  example's input is a (disfluent) question followed by ``context:`` and its passage, the target
  is the gold answer. ``pip download`` cannot fetch this archive (its metadata declares a direct
  URL dependency, which pip refuses), so the archive's link is read from the package index pip is
  configured with, and its SHA-256 from the link is checked.
"""

from __future__ import annotations

import glob
import hashlib
import json
import re
import subprocess
import tarfile
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from slimrag.index.core import Index
    from slimrag.ingest.source import Inputs

DATA = Path(__file__).resolve().parent / "data"
BIGBENCH = "bigbench-1.0.0.tar.gz"
DISFL_MEMBER = "bigbench-1.0.0/bigbench/benchmark_tasks/disfl_qa/task.json"


def _run(cmd: list[str], cwd: Path) -> None:
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True)


def saved_index(path: Path, inputs: Callable[[], Inputs], **build: Any) -> Index:
    """The index saved at ``path`` (a built one has its manifest), or, when there is none yet, the one
    `Index.build` makes there from ``inputs()`` with the keywords ``build`` (``storage``,
    ``overwrite``): the benchmarks' sets are indexed once, on first use. ``inputs`` is called only to
    build (reading a corpus can take minutes)."""
    from slimrag.index.core import Index

    if (path / "manifest.json").is_file():
        return Index.open(path)
    return Index.build(inputs(), path, **build)


def python_docs_dir() -> Path:
    """Extracted Python 3.11 documentation sources (downloaded once)."""
    DATA.mkdir(exist_ok=True)
    out = DATA / "python3.11-doc"
    src = out / "usr/share/doc/python3.11/html/_sources"
    if src.is_dir():
        return src
    debs = sorted(DATA.glob("python3.11-doc_*.deb"))
    if not debs:
        _run(["apt-get", "download", "python3.11-doc"], DATA)
        debs = sorted(DATA.glob("python3.11-doc_*.deb"))
    _run(["dpkg", "-x", str(debs[-1]), str(out)], DATA)
    return src


def python_doc_paragraphs(min_words: int = 8) -> list[tuple[str, str]]:
    """(source, paragraph) pairs: every blank-line-separated block of the reST sources with at least
    ``min_words`` words; the source is ``file.rst.txt#n``."""
    src = python_docs_dir()
    out: list[tuple[str, str]] = []
    for f in sorted(glob.glob(str(src / "**/*.txt"), recursive=True)):
        rel = Path(f).relative_to(src).as_posix()
        text = Path(f).read_text(encoding="utf-8", errors="replace")
        for n, para in enumerate(p.strip() for p in re.split(r"\n\s*\n", text)):
            if len(para.split()) >= min_words:
                out.append((f"{rel}#{n}", para))
    return out


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links += [v for k, v in attrs if k == "href" and v]


def _index_url() -> str:
    """The package index pip uses (its configured index-url, else pip's built-in default)."""
    res = subprocess.run(["pip", "config", "get", "global.index-url"], capture_output=True, text=True)
    if res.returncode == 0 and res.stdout.strip():
        return res.stdout.strip()
    from pip._internal.models.index import PyPI

    return PyPI.simple_url


def bigbench_archive() -> Path:
    """The bigbench 1.0.0 source archive (358 MB), downloaded once and checked against its hash."""
    DATA.mkdir(exist_ok=True)
    path = DATA / BIGBENCH
    if path.is_file():
        return path
    page = urllib.request.urlopen(f"{_index_url().rstrip('/')}/bigbench/", timeout=60).read().decode()
    parser = _Links()
    parser.feed(page)
    link = next(u for u in parser.links if BIGBENCH in u)
    url, _, frag = link.partition("#sha256=")
    tmp = path.with_suffix(".part")
    h = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=600) as r, open(tmp, "wb") as f:
        while block := r.read(1 << 20):
            h.update(block)
            f.write(block)
    if frag and h.hexdigest() != frag:
        tmp.unlink()
        raise RuntimeError(f"{BIGBENCH}: sha256 mismatch")
    tmp.rename(path)
    return path


@dataclass(frozen=True)
class QA:
    """One disfl_qa example: question, its gold passage and the gold answer."""

    question: str
    context: str
    answer: str


def disfl_qa() -> list[QA]:
    """All 8,000 disfl_qa examples (1,204 distinct passages)."""
    cache = DATA / "disfl_qa.json"
    if not cache.is_file():
        with tarfile.open(bigbench_archive()) as t:
            member = t.extractfile(DISFL_MEMBER)
            assert member is not None
            task = json.load(member)
        rows = []
        for ex in task["examples"]:
            q, _, ctx = ex["input"].partition("context:")
            target = ex["target"] if isinstance(ex["target"], str) else ex["target"][0]
            rows.append({"question": " ".join(q.split()), "context": " ".join(ctx.split()), "answer": target})
        cache.write_text(json.dumps(rows))
    return [QA(**r) for r in json.loads(cache.read_text())]


def cached_embeddings(name: str, texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Embeddings of ``texts`` with the default embedder, computed once and kept in
    ``bench/data/emb-NAME-HASH.npy`` (the hash covers the texts, so a changed corpus re-embeds)."""
    import numpy as np

    from slimrag.embed.local import LocalEmbedder

    h = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
    path = DATA / f"emb-{name}-{h}.npy"
    if path.is_file():
        return np.load(path)
    vecs = LocalEmbedder().embed(texts, batch_size=batch_size, progress=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, vecs)
    tmp.rename(path)
    return vecs
