"""The servers people run: `RemoteGenerator` against Ollama's and llama.cpp's OpenAI endpoints.

The suite's real local HTTP server (`openai_server.OpenAIServer`) speaks each server family's
shape field for field, as their sources write it (cited in `openai_server.OllamaShape` and
`openai_server.LlamaCppShape`): how chunks look, where usage comes and what it holds, thinking
text, errors. Each test checks what slimrag reads from that shape against what the server sent,
computed from the server's documented rules (the reply echoes the question; tokens are words;
cached tokens are the longest word prefix shared with an earlier prompt).

What each family reports, in short (details in `slimrag.llm.remote`'s header):

| | text | finish | usage in stream | cached tokens | mid-stream error |
|---|---|---|---|---|---|
| OpenAI, vLLM | ``delta.content`` | last choice | with ``include_usage`` | ``prompt_tokens_details`` | ``data: {"error"}`` |
| Ollama | same, role on every chunk | same | with ``include_usage`` only | never | ``data: {"error"}`` |
| llama-server | same, first ``content: null`` | same | with ``include_usage``, plus ``timings`` | both | ``error: {...}`` |
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai_server import REASONING, OpenAIServer

from slimrag.config import GenerationConfig
from slimrag.errors import BackendError
from slimrag.llm.base import Delta
from slimrag.llm.remote import RemoteGenerator
from slimrag.prompt import Passage, Prompt
from slimrag.types import Usage

TIMEOUT = 5.0
SHAPES = ("openai", "ollama", "llamacpp")
MODEL = {"openai": "test-model", "ollama": "llama3.2:latest", "llamacpp": "model.gguf"}
PROMPT = Prompt(question="Which moons does Mars have?",
                passages=(Passage("1", "space/mars.md#0", "Mars has two small moons, Phobos and Deimos."),))


@pytest.fixture(params=SHAPES)
def server(request: pytest.FixtureRequest) -> Iterator[OpenAIServer]:
    with OpenAIServer(shape=request.param, models=[MODEL[request.param]]) as srv:
        yield srv


def generate(srv: OpenAIServer, prompt: Prompt = PROMPT, **config: object) -> tuple[str, Delta]:
    """The streamed text and the last delta (usage, finish reason), model picked from /v1/models."""
    with RemoteGenerator(srv.base_url, timeout=TIMEOUT) as gen:
        deltas = list(gen.stream(prompt, GenerationConfig(**config)))  # type: ignore[arg-type]
    return "".join(d.text for d in deltas), deltas[-1]


def expected(srv: OpenAIServer, max_tokens: int = 256) -> tuple[str, str, int]:
    """What the server answers to `PROMPT`: text, finish reason, prompt tokens."""
    messages = PROMPT.messages()
    text, reason = srv.reply(messages, max_tokens)
    return text, reason, len(srv.prompt_text(messages).split())


def test_text_finish_reason_and_usage(server: OpenAIServer) -> None:
    text, last = generate(server)
    want, reason, prompt_tokens = expected(server)
    assert text == want and last.finish_reason == reason == "stop"
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (prompt_tokens, len(want.split()))
    chat = server.requests_to("chat/completions")[-1]["body"]
    assert chat["model"] == MODEL[server.shape] and chat["stream_options"] == {"include_usage": True}


def test_cut_at_max_tokens_reports_length(server: OpenAIServer) -> None:
    text, last = generate(server, max_new_tokens=3)
    want, reason, _ = expected(server, 3)
    assert text == want and last.finish_reason == reason == "length"
    assert last.usage is not None and last.usage.completion_tokens == 3


def test_cached_tokens_as_each_server_reports_them(server: OpenAIServer) -> None:
    generate(server)
    _, again = generate(server)  # the same prompt: every prompt token is a cached prefix
    assert again.usage is not None
    prompt_tokens = expected(server)[2]
    reported = {"openai": prompt_tokens, "llamacpp": prompt_tokens, "ollama": 0}  # Ollama reports none
    assert again.usage.cached_tokens == reported[server.shape]


@pytest.mark.parametrize("shape", SHAPES)
def test_server_without_stream_usage(shape: str) -> None:
    """A server that ignores ``include_usage``: counts come from llama-server's ``timings``
    (what builds before its usage support send); others leave them at zero."""
    with OpenAIServer(shape=shape, models=[MODEL[shape]], stream_usage=False) as srv:
        generate(srv)
        text, last = generate(srv)
        want, _, prompt_tokens = expected(srv)
    assert text == want and last.usage is not None
    if shape == "llamacpp":
        u = last.usage
        assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == (prompt_tokens, len(want.split()),
                                                                           prompt_tokens)
    else:
        assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.cached_tokens) == (0, 0, 0)


def test_llamacpp_usage_alone_and_usage_without_cache_details() -> None:
    with OpenAIServer(shape="llamacpp", models=["m"], timings=False) as srv:  # usage only
        _, first = generate(srv)
        _, second = generate(srv)
    assert first.usage is not None and second.usage is not None
    assert second.usage.cached_tokens == second.usage.prompt_tokens > 0
    assert first.usage.cached_tokens == 0
    with OpenAIServer(shape="llamacpp", models=["m"], usage_details=False) as srv:  # cache only in timings
        generate(srv)
        _, again = generate(srv)
        prompt_tokens = expected(srv)[2]
    assert again.usage is not None
    assert (again.usage.prompt_tokens, again.usage.cached_tokens) == (prompt_tokens, prompt_tokens)


@pytest.mark.parametrize("shape", SHAPES)
def test_thinking_text_is_not_part_of_the_answer(shape: str) -> None:
    with OpenAIServer(shape=shape, models=[MODEL[shape]], reasoning=True) as srv:
        text, last = generate(srv)
        want = expected(srv)[0]
    assert text == want and REASONING.split()[0] not in text
    assert last.finish_reason == "stop"


def test_whole_completion_answer_to_a_stream_request(server: OpenAIServer) -> None:
    server.stream_fault = "json"  # a server (or proxy) that does not stream
    text, last = generate(server)
    want, _, prompt_tokens = expected(server)
    assert text == want and last.usage is not None and last.usage.prompt_tokens == prompt_tokens


def test_http_error_bodies_give_the_server_message(server: OpenAIServer) -> None:
    server.fail_status, server.fail_message = 500, "out of memory while loading the model"
    with pytest.raises(BackendError, match="HTTP 500: out of memory while loading the model"):
        generate(server)


def test_unknown_model() -> None:
    """Ollama refuses a model it has not pulled (its message says so); llama-server serves the
    model it loaded whatever the request calls it."""
    with OpenAIServer(shape="ollama", models=["llama3.2:latest"]) as srv, \
            RemoteGenerator(srv.base_url, model="mistral", timeout=TIMEOUT) as gen:
        with pytest.raises(BackendError, match='HTTP 404: model "mistral" not found, try pulling it first'):
            list(gen.stream(PROMPT))
    with OpenAIServer(shape="llamacpp", models=["model.gguf"]) as srv, \
            RemoteGenerator(srv.base_url, model="anything", timeout=TIMEOUT) as gen:
        assert "".join(d.text for d in gen.stream(PROMPT)) == srv.reply(PROMPT.messages())[0]


def test_failure_after_the_stream_began(server: OpenAIServer) -> None:
    """llama-server's ``error:`` field (then ``data: [DONE]``) must not read as a short answer."""
    server.stream_fault, server.fail_message = "error", "the request exceeds the available context size"
    with RemoteGenerator(server.base_url, timeout=TIMEOUT) as gen:
        stream = gen.stream(PROMPT)
        first = next(stream)
        assert first.text  # one piece arrived before the failure
        with pytest.raises(BackendError, match="mid-stream: the request exceeds the available context size"):
            list(stream)


def test_rag_answer_through_each_server(server: OpenAIServer, tmp_path: object, embedder: object) -> None:
    """The whole path a user runs (`slimrag ask --llm URL`): retrieval, prompt, remote generation."""
    from pathlib import Path

    from conftest import write_tree

    from slimrag.index.core import Index
    from slimrag.rag.pipeline import RAG

    root = write_tree(Path(str(tmp_path)) / "docs", {"mars.md": "# Mars\n\nMars has two moons, Phobos and Deimos."})
    with Index.build(root, Path(str(tmp_path)) / "idx", embedder=embedder) as idx:  # type: ignore[arg-type]
        answer = RAG(idx, server.base_url).ask("Which moons does Mars have?", k=1)
    assert answer.text == "echo: Question: Which moons does Mars have?"
    assert answer.sources[0].source == "mars.md" and answer.finish_reason == "stop"
    assert isinstance(answer.usage, Usage) and answer.usage.prompt_tokens > 0
