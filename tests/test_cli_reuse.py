"""``--reuse`` and ``--recompute`` on ask, chat and serve (click's CliRunner, a real index on disk).

Ground truth: the `CacheConfig` the embedded generator was built with, and the ``reuse`` its
answer reports. The generator is the real one; the tests only record which one the backend
registry handed out (serve: and stop before the HTTP server would start).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slimrag.cli import cli
from slimrag.cli.options import REUSE_CHOICES
from slimrag.embed.local import LocalEmbedder
from slimrag.errors import ModelNotFoundError
from slimrag.index.core import Index
from slimrag.llm import backends, weights
from slimrag.llm.kv.config import PERSISTENT, REUSE_MODES


@pytest.fixture()
def index(docs_dir: Path, tmp_path: Path, embedder: LocalEmbedder) -> Path:
    with Index.build(docs_dir, tmp_path / "reuse.slimrag", embedder=embedder) as idx:
        return Path(idx.root)


@pytest.fixture()
def made(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Generators the local backend builds during the test (the real factory, recorded)."""
    built: list[Any] = []
    real = backends.BACKENDS["local"]

    def recording(spec: str | None, **options: Any) -> Any:
        built.append(real(spec, **options))
        return built[-1]

    monkeypatch.setitem(backends.BACKENDS, "local", recording)
    return built


def test_reuse_choices_are_the_configs_modes() -> None:
    assert REUSE_CHOICES == REUSE_MODES


def test_ask_reuse_blend_reaches_the_generators_cache_config(index: Path, made: list[Any]) -> None:
    try:
        weights.default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    r = CliRunner().invoke(cli, ["ask", str(index), "Where does Whiskers sleep?", "-k", "1", "--max-tokens", "1",
                                 "--reuse", "blend", "--recompute", "boundary:8", "--json"])
    assert r.exit_code == 0, r.output
    assert [g.cache_spec for g in made] == [replace(PERSISTENT, reuse="blend", recompute="boundary:8")]
    assert made[0].reuse.recompute == "boundary:8"
    assert json.loads(r.stdout.strip().splitlines()[-1])["usage"]["reuse"] == "blend"


def test_serve_reuse_reaches_the_generator(index: Path, made: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from slimrag.api import listen
    from slimrag.serve import app as serve_app

    served: list[Any] = []

    def run(app: Any, sock: Any, host: str, **kw: Any) -> None:  # serve's uvicorn loop, not entered
        served.append({"host": host, "port": sock.getsockname()[1]})
        sock.close()

    monkeypatch.setattr(serve_app, "warm_up", served.append)  # no model load: the config is what counts
    monkeypatch.setattr(listen, "run", run)
    r = CliRunner().invoke(cli, ["serve", str(index), "--port", "0", "--reuse", "blend", "--recompute", "none"])
    assert r.exit_code == 0, r.output
    assert served[0].llm is made[0] and served[1]["host"] == "127.0.0.1" and served[1]["port"] > 0
    assert made[0].cache_spec == replace(PERSISTENT, reuse="blend", recompute="none")
    r = CliRunner().invoke(cli, ["serve", str(index), "--port", "0"])
    assert r.exit_code == 0, r.output
    assert made[1].cache_spec == PERSISTENT  # no flag: the default exact tree, its disk tier kept across processes


@pytest.mark.parametrize(("verb", "args", "message"), [
    ("ask", ["q", "--reuse", "blend", "--recompute", "bogus:3"], "--recompute"),
    ("ask", ["q", "--reuse", "mixed"], "--reuse"),
    ("ask", ["q", "--recompute", "boundary:8"], "give --reuse blend too"),
    ("ask", ["q", "--reuse", "blend", "--llm", "http://127.0.0.1:9/v1"], "--reuse configures the embedded"),
    ("chat", ["--reuse", "blend", "--recompute", "deviation:2"], "--recompute"),
    ("serve", ["--recompute", "boundary:x"], "--recompute"),
    ("serve", ["--reuse", "blend", "--llm", "http://127.0.0.1:9/v1"], "--reuse configures the embedded"),
])
def test_bad_reuse_flags_are_named(index: Path, made: list[Any], verb: str, args: list[str], message: str) -> None:
    r = CliRunner().invoke(cli, [verb, str(index), *args], input="\n")
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert made == []  # refused before any model was built
