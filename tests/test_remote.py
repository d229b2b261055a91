"""RemoteGenerator and RemoteEmbedder against a real OpenAI-compatible HTTP server on 127.0.0.1.

The server (tests/openai_server.py) is deterministic, so expected texts, vectors and token counts
are computed from its documented rules rather than hard-coded. Every client gets a short timeout
so a broken server fails a test instead of hanging it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from types import GeneratorType

import numpy as np
import pytest
from openai_server import OpenAIServer

from slimrag.config import GenerationConfig
from slimrag.embed.remote import RemoteEmbedder
from slimrag.errors import BackendError, SlimragError
from slimrag.llm.backends import BACKENDS, make_generator, register_backend
from slimrag.llm.base import Delta, Generator
from slimrag.llm.remote import RemoteGenerator, api_root
from slimrag.prompt import Passage, Prompt
from slimrag.types import Usage

TIMEOUT = 5.0
PROMPT = Prompt(
    question="What does slimrag store on disk?",
    passages=(
        Passage("1", "docs/index.md#0", "An index is one folder with a manifest and a catalog."),
        Passage("2", "docs/graph.md#3", "The graph is stored as CSR arrays with PQ codes."),
    ),
)


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


@pytest.fixture
def gen(server: OpenAIServer) -> Iterator[RemoteGenerator]:
    with RemoteGenerator(server.base_url, model="test-model", timeout=TIMEOUT) as g:
        yield g


# -- URL rule ------------------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"])
def test_api_root_appends_v1_once(given: str) -> None:
    assert api_root(given) == "http://h:8000/v1"


def test_api_root_keeps_prefix_and_rejects_non_http() -> None:
    assert api_root("https://proxy.example/llm/v1") == "https://proxy.example/llm/v1"
    with pytest.raises(BackendError, match="not an http"):
        api_root("127.0.0.1:8000")


# -- embeddings ----------------------------------------------------------------------------------


def test_embeddings_shape_norm_and_order(server: OpenAIServer) -> None:
    texts = ["the cat sat on the mat", "a cat sat on a mat", "quantum chromodynamics", "zebra"]
    with RemoteEmbedder(server.base_url, "test-model", timeout=TIMEOUT) as emb:
        assert emb.dim == 0  # discovered on first call
        vecs = emb.embed_batch(texts)
        assert emb.dim == 32 and emb.model_id == "remote:test-model"
    assert vecs.shape == (4, 32) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    # The server answers in reverse order; rows must still follow the input order.
    expected = np.array([OpenAIServer.embed_text(t) for t in texts], dtype=np.float32)
    np.testing.assert_allclose(vecs, expected, atol=1e-6)
    sims = vecs @ vecs.T
    assert sims[0, 1] > sims[0, 2] and sims[0, 1] > sims[0, 3]
    assert server.requests_to("embeddings")[0]["body"] == {"model": "test-model", "input": texts}


def test_embed_in_three_batches_equals_one_call(server: OpenAIServer) -> None:
    texts = [f"passage number {i} about topic {i % 3}" for i in range(6)]
    with RemoteEmbedder(server.base_url, "test-model", dim=32, timeout=TIMEOUT) as emb:
        batched = emb.embed(texts, batch_size=2, progress=False)
        whole = emb.embed_batch(texts)
    assert len(server.requests_to("embeddings")) == 4
    np.testing.assert_allclose(batched, whole, atol=1e-6)


def test_embedding_dim_mismatch_and_probe(server: OpenAIServer) -> None:
    with RemoteEmbedder(server.base_url, "test-model", timeout=TIMEOUT) as emb:
        assert emb.ensure_dim() == 32
    with RemoteEmbedder(server.base_url, "test-model", dim=384, timeout=TIMEOUT) as emb:
        with pytest.raises(BackendError, match="32-dimensional vectors, expected 384"):
            emb.embed_batch(["x"])


def test_embedding_errors_are_backend_errors(server: OpenAIServer) -> None:
    with RemoteEmbedder(server.base_url, "no-such-model", timeout=TIMEOUT) as emb:
        with pytest.raises(BackendError, match=r"HTTP 404: The model `no-such-model` does not exist"):
            emb.embed_batch(["x"])
    server.malformed = True
    with RemoteEmbedder(server.base_url, "test-model", timeout=TIMEOUT) as emb:
        with pytest.raises(BackendError, match="not JSON"):
            emb.embed_batch(["x"])


# -- generation ----------------------------------------------------------------------------------


def test_backend_registry_builds_remote_without_torch_and_takes_new_kinds() -> None:
    code = ("import sys; from slimrag.llm.backends import make_generator; "
            "g = make_generator('http://127.0.0.1:9/v1'); "
            "print(type(g).__name__, g.base_url, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["RemoteGenerator", "http://127.0.0.1:9/v1", "False"]

    class Fixed(Generator):
        def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
            yield Delta("", usage=Usage(), finish_reason="stop")

    made: list[str | None] = []
    register_backend("fixed", lambda spec: made.append(spec) or Fixed())
    try:
        assert isinstance(make_generator("fixed://anything"), Fixed) and made == ["fixed://anything"]
        mine = Fixed()
        assert make_generator(mine) is mine
    finally:
        BACKENDS.pop("fixed")
    with pytest.raises(ValueError, match="registered backend.*http.*got 'ftp://h'"):
        make_generator("ftp://h")


def test_capabilities_are_declared_and_load_is_a_no_op(gen: RemoteGenerator) -> None:
    assert gen.thread_safe and gen.shadows_prefix_cache
    assert gen.default_repetition_penalty == 1.0
    assert gen.load() is None and gen.planning_cache() is None


def test_generate_returns_echo_and_usage(server: OpenAIServer, gen: RemoteGenerator) -> None:
    out = gen.generate(PROMPT, GenerationConfig(max_new_tokens=64))
    expected, _ = OpenAIServer.reply(PROMPT.messages())
    assert out.text == expected == "echo: Question: What does slimrag store on disk?"
    assert out.finish_reason == "stop"
    prompt_tokens = len(OpenAIServer.prompt_text(PROMPT.messages()).split())
    assert out.usage.prompt_tokens == prompt_tokens
    assert out.usage.completion_tokens == len(expected.split())
    assert out.usage.cached_tokens == 0
    assert 0 < out.usage.ttft_s <= out.usage.total_s


def test_stream_pieces_join_to_full_text(gen: RemoteGenerator) -> None:
    deltas = list(gen.stream(PROMPT))
    pieces = [d.text for d in deltas[:-1]]
    assert len(pieces) == 8 and all(pieces)  # one per word; the role-only chunk yields nothing
    assert deltas[-1].usage is not None and deltas[-1].finish_reason == "stop"
    assert all(d.usage is None for d in deltas[:-1])
    assert "".join(pieces) == gen.generate(PROMPT).text


def test_request_body_carries_prompt_and_sampling(server: OpenAIServer, gen: RemoteGenerator) -> None:
    cfg = GenerationConfig(max_new_tokens=3, temperature=0.7, top_p=0.9, stop=("###",))
    out = gen.generate(PROMPT, cfg)
    assert out.text == "echo: Question: What" and out.finish_reason == "length"
    body = server.requests_to("chat/completions")[-1]["body"]
    assert body["messages"] == PROMPT.messages()
    assert body["model"] == "test-model"
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.7, 0.9, 3)
    assert body["stop"] == ["###"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_stop_string_is_sent_and_honoured(gen: RemoteGenerator) -> None:
    out = gen.generate(Prompt(question="alpha beta gamma"), GenerationConfig(stop=("gamma",)))
    assert out.text == "echo: Question: alpha beta " and out.finish_reason == "stop"


def test_same_prompt_twice_hits_prefix_cache(gen: RemoteGenerator) -> None:
    first = gen.generate(PROMPT).usage
    second = gen.generate(PROMPT).usage
    assert first.cached_tokens == 0
    assert second.cached_tokens == second.prompt_tokens > 0
    # Same passages, other question: the shared prefix (system + passages) is reused.
    other = Prompt(question="Where are hubs kept?", passages=PROMPT.passages)
    third = gen.generate(other).usage
    assert 0 < third.cached_tokens < third.prompt_tokens


def test_server_ignoring_stream_options_gives_timings_only(server: OpenAIServer, gen: RemoteGenerator) -> None:
    server.stream_usage = False
    out = gen.generate(PROMPT)
    assert out.text.startswith("echo: ")
    u = out.usage
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == (0, 0, 0)
    assert 0 < u.ttft_s <= u.total_s


def test_ttft_is_taken_at_first_piece(server: OpenAIServer, gen: RemoteGenerator) -> None:
    server.chunk_delay_s = 0.05  # 12 events: role, 8 words, finish, usage, [DONE]
    u = gen.generate(PROMPT).usage
    assert 0.08 <= u.ttft_s < u.total_s - 0.2


def test_leaving_stream_early_closes_connection(server: OpenAIServer, gen: RemoteGenerator) -> None:
    server.chunk_delay_s = 0.05
    stream = gen.stream(PROMPT)
    assert isinstance(stream, GeneratorType)  # closable, which is how callers leave early
    assert next(stream).text == "echo: "
    stream.close()
    # The next request still works on a fresh connection.
    server.chunk_delay_s = 0.0
    assert gen.generate(PROMPT).text.startswith("echo: ")


def test_model_discovered_from_models_endpoint() -> None:
    with OpenAIServer(models=("served-a", "served-b")) as srv:
        with RemoteGenerator(srv.base_url.removesuffix("/v1"), timeout=TIMEOUT) as g:
            assert g.resolve_model() == "served-a"
            g.generate(PROMPT)
            g.generate(PROMPT)
            assert g.name.startswith("remote:served-a@")
        assert len(srv.requests_to("/v1/models")) == 1  # asked once
        assert all(r["body"]["model"] == "served-a" for r in srv.requests_to("chat/completions"))


def test_no_models_listed_says_pass_model() -> None:
    with OpenAIServer(models=()) as srv, RemoteGenerator(srv.base_url, timeout=TIMEOUT) as g:
        with pytest.raises(BackendError, match="pass model="):
            g.generate(PROMPT)


# -- keys and failures ---------------------------------------------------------------------------


def test_api_key_is_sent_and_required() -> None:
    with OpenAIServer(api_key="sekret") as srv:
        with RemoteGenerator(srv.base_url, "test-model", api_key="sekret", timeout=TIMEOUT) as g:
            assert g.generate(PROMPT).text.startswith("echo: ")
        assert srv.requests[-1]["headers"]["authorization"] == "Bearer sekret"
        with RemoteEmbedder(srv.base_url, "test-model", api_key="sekret", timeout=TIMEOUT) as emb:
            assert emb.embed_batch(["x"]).shape == (1, 32)
        with RemoteGenerator(srv.base_url, "test-model", timeout=TIMEOUT) as g:
            with pytest.raises(BackendError, match=r"HTTP 401: Incorrect API key.*api_key="):
                g.generate(PROMPT)


def test_http_500_raises_with_server_message(server: OpenAIServer, gen: RemoteGenerator) -> None:
    server.fail_status, server.fail_message = 500, "CUDA out of memory"
    with pytest.raises(BackendError, match=r"HTTP 500: CUDA out of memory.*check its log") as info:
        gen.generate(PROMPT)
    assert "/v1/chat/completions" in str(info.value)
    with RemoteEmbedder(server.base_url, "test-model", timeout=TIMEOUT) as emb:
        with pytest.raises(BackendError, match="HTTP 500: CUDA out of memory"):
            emb.embed_batch(["x"])


def test_connection_refused_raises_backend_error() -> None:
    with OpenAIServer() as srv:
        url = srv.base_url
    # The server is stopped: its port now refuses connections.
    with RemoteGenerator(url, "test-model", timeout=TIMEOUT) as g:
        with pytest.raises(BackendError, match="cannot connect.*is the server running"):
            g.generate(PROMPT)
    with RemoteGenerator(url, timeout=TIMEOUT) as g:  # model discovery fails the same way
        with pytest.raises(BackendError, match="cannot connect"):
            g.resolve_model()
    with RemoteEmbedder(url, "test-model", timeout=TIMEOUT) as emb:
        with pytest.raises(SlimragError, match="cannot connect"):
            emb.embed_batch(["x"])


def test_malformed_stream_raises(server: OpenAIServer, gen: RemoteGenerator) -> None:
    server.malformed = True
    stream = gen.stream(PROMPT)
    assert next(stream).text == "echo: "  # the good piece before the broken one
    with pytest.raises(BackendError, match="malformed JSON"):
        next(stream)


def test_read_timeout_raises(server: OpenAIServer) -> None:
    server.chunk_delay_s = 0.5
    with RemoteGenerator(server.base_url, "test-model", timeout=0.2) as g:
        with pytest.raises(BackendError, match="no answer .* within 0.2 s"):
            g.generate(PROMPT)


def test_error_chunk_mid_stream_raises(server: OpenAIServer, gen: RemoteGenerator) -> None:
    server.stream_fault, server.fail_message = "error", "context length exceeded"
    with pytest.raises(BackendError, match="error mid-stream: context length exceeded"):
        gen.generate(PROMPT)


def test_cut_stream_raises(server: OpenAIServer, gen: RemoteGenerator) -> None:
    server.stream_fault = "cut"
    with pytest.raises(BackendError, match="ended before its last chunk"):
        gen.generate(PROMPT)


def test_server_answering_stream_with_plain_json(server: OpenAIServer, gen: RemoteGenerator) -> None:
    server.stream_fault = "json"
    deltas = list(gen.stream(PROMPT))
    assert [d.text for d in deltas] == [OpenAIServer.reply(PROMPT.messages())[0], ""]
    assert deltas[-1].usage is not None and deltas[-1].usage.prompt_tokens > 0
