"""Shared fixtures: offline environment, the real embedder (loaded once), small real corpora."""

from __future__ import annotations

import os
import random

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

# `make test` runs two pytest-xdist workers. torch's default, one thread per core in each worker,
# oversubscribes the cores, and its threads then wait on each other: a search test ran 13-60 s
# beside the other worker against 1.3-4.8 s with the cores shared out (2026-11-29). So each
# worker takes its share of the cores; tests that need a thread count set it themselves.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from openai_server import OpenAIServer  # noqa: E402

from slimrag.embed.local import LocalEmbedder  # noqa: E402
from slimrag.errors import ModelNotFoundError  # noqa: E402
from slimrag.llm import weights  # noqa: E402
from slimrag.prompt import Passage  # noqa: E402

DOCS = {
    "guide/install.md": "# Installing\n\nRun `make demo` to install slimrag into a virtual environment.\n\n"
                        "## Windows\n\nOn Windows use WSL; native paths are not supported yet.\n",
    "guide/cats.md": "# Cats\n\nThe office cat is named Whiskers. Whiskers sleeps on the radiator all winter.\n",
    "notes/weather.txt": "Rain is expected on Tuesday; the forecast says sunny skies on Friday.\n",
    "notes/recipes.rst": "Bread\n=====\n\nMix flour, water, salt and yeast. Bake at 230 degrees for forty minutes.\n\n"
                         "Soup\n====\n\nSimmer lentils with onion and cumin for half an hour.\n",
    "code/fib.py": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
                   "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "data/planets.json": '{"planets": [{"name": "Mars", "note": "the red planet has two moons"}, '
                         '{"name": "Jupiter", "note": "the largest planet in the solar system"}]}',
    "data/people.jsonl": '{"name": "Ada Lovelace", "known_for": "first computer program"}\n'
                         '{"name": "Alan Turing", "known_for": "the Turing machine"}\n',
    "site/index.html": "<html><head><style>p{}</style><script>var x=1;</script></head><body>"
                       "<h1>Lighthouse</h1><p>The lighthouse keeper lights the lamp at dusk.</p></body></html>",
}


def pdf_with_content(content: bytes, flate: bool = False) -> bytes:
    """A one-page PDF whose page content stream is ``content`` (verbatim, or Flate-compressed with
    ``flate``: a few KB that a reader expands to megabytes), with a correct xref."""
    import zlib

    stream, filters = (zlib.compress(content, 9), b" /Filter /FlateDecode") if flate else (content, b"")
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + filters + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def make_pdf(text: str) -> bytes:
    """A minimal valid one-page PDF whose page shows ``text`` (Helvetica)."""
    return pdf_with_content(f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode())


def write_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    """Write ``files`` (relative path → content) under ``root``."""
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")
    return root


#: Words of the random passages of the warm-generation tests.
WORDS = ("river stone cat moon paper green seven blue house tree light harbour lamp tower "
         "winter apple clock bridge violin garden").split()


def word_passages(rng: random.Random, n: int = 8, max_words: int = 24) -> list[Passage]:
    """Short random passages: cheap to prefill, different enough to change the answer."""
    return [Passage(f"p{i}", f"notes/{i}.md#0",
                    " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, max_words))) + ".")
            for i in range(n)]


#: The bad inputs of :func:`write_mixed_tree`, each of which must be skipped with one warning.
BAD_FILES = ("corrupt.pdf", "binary.txt", "latin1.txt", "huge.txt")


def write_mixed_tree(root: Path) -> Path:
    """Three good files (markdown, text, PDF) beside the :data:`BAD_FILES`: a corrupt PDF, a binary
    file, invalid UTF-8 and a sparse 200 MB file over the size limit."""
    write_tree(root, {
        "good.md": "# Volcano\n\nMount Etna erupted again in spring.",
        "good2.txt": "The submarine dived to four hundred metres.",
        "corrupt.pdf": b"%PDF-1.7\n%\xe2\xe3\n1 0 obj <</Type /Catalog /Pages 9 0 R>> trailer",
        "binary.txt": bytes(range(256)) * 64,
        "latin1.txt": "na\xefve caf\xe9".encode("latin-1"),
        "ok.pdf": make_pdf("Pluto was reclassified as a dwarf planet."),
    })
    with open(root / "huge.txt", "wb") as f:  # sparse: no disk used
        f.truncate(200 * 2**20)
    return root


@pytest.fixture(scope="session")
def embedder() -> LocalEmbedder:
    """The real all-MiniLM-L6-v2, loaded once per test session."""
    e = LocalEmbedder()
    e.embed_batch(["warm up"])
    return e


@pytest.fixture()
def docs_dir(tmp_path: Path) -> Path:
    """A small mixed-format folder, including a PDF."""
    root = write_tree(tmp_path / "docs", DOCS)
    (root / "papers").mkdir()
    (root / "papers" / "telescope.pdf").write_bytes(make_pdf("The telescope was pointed at the Andromeda galaxy."))
    return root


#: The torch threads the embedded model is loaded and tested on (:func:`smollm`).
TEST_THREADS = 1


@pytest.fixture(scope="session")
def _smollm_loaded() -> weights.LoadedModel:
    """The embedded SmolLM2, loaded once per test session (a load maps the file and builds the
    engine: about a second, paid once instead of once per module). Skips when the model package is
    not installed. Loaded on :data:`TEST_THREADS` torch threads, the count :func:`smollm` runs the
    tests at: the load checks the bfloat16 prefill's wide call sizes at its thread count, and a
    product run at another count falls back to 128-row calls, so a load at the default count
    would leave the wide calls untested end to end."""
    import torch

    try:
        weights.default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    threads = torch.get_num_threads()
    torch.set_num_threads(TEST_THREADS)
    try:
        return weights.load_model(device="cpu")
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def smollm(_smollm_loaded: weights.LoadedModel) -> Iterator[weights.LoadedModel]:
    """The embedded SmolLM2, run on :data:`TEST_THREADS` (one) torch thread in the module that
    uses it: with two threads on two cores that other processes also use, torch's threads spin
    against each other (an exactness test took 443 s instead of 27 s). It is the count the load
    checked the bfloat16 call sizes at, so the exactness tests run the wide calls a long pass
    takes (``tests/test_bf16_wide_exact.py`` checks that they do)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(TEST_THREADS)
    try:
        yield _smollm_loaded
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def echo() -> Iterator[OpenAIServer]:
    """A local OpenAI-style server (tests/openai_server.py) per module, for RAG over HTTP; a module
    that needs another pace defines its own ``echo``."""
    with OpenAIServer() as srv:
        yield srv


@pytest.fixture(autouse=True)
def _library_log_levels() -> Iterator[None]:
    """Each test leaves the libraries' log levels as it found them. A CLI test run with ``-v``
    sets torch's logger (and the other libraries') to INFO for the whole process; torch's own
    handler is bound to the stream pytest captured when torch was first imported, so at exit
    torch's INFO lines ("FakeTensor cache stats") met that closed stream and printed
    ``--- Logging error ---`` tracebacks at the end of ``make test``."""
    import logging

    from slimrag.cli.quiet import LIBRARIES, SERVER_LOGGERS

    names = (None, *LIBRARIES, *SERVER_LOGGERS)
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def layers_equal(a, b) -> bool:  # noqa: ANN001  (two KVCache)
    """Whether two model caches hold bitwise the same per-layer K and V."""
    import torch

    return all(torch.equal(x, y) for (ka, va), (kb, vb) in zip(a.layers(), b.layers(), strict=True)
               for x, y in ((ka, kb), (va, vb)))
