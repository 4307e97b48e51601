"""The fake engines in tests/fixtures behave as their names say, as real subprocesses."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.fixtures import fake_dies_midstream, fake_invalid_json
from tests.fixtures.launch import FakeEngine, FakeStartError, start_fake

CHUNKS = 5
FAST = ("--latency-ms", "0", "--chunk-delay-ms", "0")
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hello big wide world"}]}
STREAM = {**CHAT, "stream": True}
TIMINGS_KEYS = {
    "cache_n",
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
}


@pytest.fixture(scope="module")
def openai() -> Iterator[FakeEngine]:
    with start_fake("fake_openai", *FAST, "--chunks", str(CHUNKS), "--cache-n", "2") as engine:
        yield engine


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, str, Any]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with http.post(url, data=data) as resp:
        return resp.status, resp.headers["Content-Type"], orjson.loads(await resp.read())


async def http_chunks(resp: aiohttp.ClientResponse) -> list[bytes]:
    """The response body split at HTTP chunk boundaries (one per server write)."""
    chunks: list[bytes] = []
    buf = b""
    async for data, end in resp.content.iter_chunks():
        buf += data
        if end and buf:
            chunks.append(buf)
            buf = b""
    if buf:
        chunks.append(buf)
    return chunks


def events(chunk: bytes) -> list[Any]:
    """The `data:` payloads of one chunk, JSON-decoded except `[DONE]`."""
    out: list[Any] = []
    for frame in chunk.split(b"\n\n"):
        if frame:
            assert frame.startswith(b"data: ")
            payload = frame[len(b"data: ") :]
            out.append(payload.decode() if payload == b"[DONE]" else orjson.loads(payload))
    return out


async def stream_chunks(http: aiohttp.ClientSession, url: str, body: Any) -> list[bytes]:
    async with http.post(url, data=orjson.dumps(body)) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        return await http_chunks(resp)


async def test_fake_openai_chat_echoes_last_user_message(
    openai: FakeEngine, http: aiohttp.ClientSession
) -> None:
    """A non-streamed chat answer is llama-server's chat.completion echoing the user."""
    status, ctype, body = await post(http, openai.url + "/v1/chat/completions", CHAT)
    assert (status, ctype) == (200, "application/json; charset=utf-8")
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == "echo"
    assert body["choices"] == [
        {
            "finish_reason": "stop",
            "index": 0,
            "message": {"role": "assistant", "content": "echo: hello big wide world"},
        }
    ]
    assert body["usage"] == {
        "completion_tokens": 5,
        "prompt_tokens": 4,
        "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    assert set(body["timings"]) == TIMINGS_KEYS
    assert (body["timings"]["cache_n"], body["timings"]["prompt_n"]) == (2, 2)


async def test_fake_openai_chat_stream_writes_each_chunk_separately(
    openai: FakeEngine, http: aiohttp.ClientSession
) -> None:
    """A stream is a role chunk, N distinct content chunks, a final chunk, then [DONE]."""
    chunks = await stream_chunks(http, openai.url + "/v1/chat/completions", STREAM)
    assert len(chunks) == 1 + CHUNKS + 2
    parsed = [events(c) for c in chunks]
    assert all(len(e) == 1 for e in parsed)
    first, *content, final, done = (e[0] for e in parsed)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert [c["choices"][0]["delta"]["content"] for c in content] == [
        f"tok{i} " for i in range(CHUNKS)
    ]
    assert {c["object"] for c in [first, *content, final]} == {"chat.completion.chunk"}
    assert len({c["id"] for c in [first, *content, final]}) == 1
    assert final["choices"] == [{"finish_reason": "stop", "index": 0, "delta": {}}]
    assert set(final["timings"]) == TIMINGS_KEYS
    assert "usage" not in final
    assert done == "[DONE]"


async def test_fake_openai_chat_stream_include_usage_adds_usage_chunk(
    openai: FakeEngine, http: aiohttp.ClientSession
) -> None:
    """With include_usage, a choices-less usage chunk (with timings) follows the final chunk."""
    body = {**STREAM, "stream_options": {"include_usage": True}}
    chunks = await stream_chunks(http, openai.url + "/v1/chat/completions", body)
    final, use = events(chunks[-2])
    assert final["choices"][0]["finish_reason"] == "stop"
    assert "timings" not in final
    assert use["choices"] == []
    assert use["usage"]["completion_tokens"] == CHUNKS
    assert use["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
    assert use["timings"]["predicted_n"] == CHUNKS
    assert events(chunks[-1]) == ["[DONE]"]


async def test_fake_openai_stream_max_tokens_cuts_chunks(
    openai: FakeEngine, http: aiohttp.ClientSession
) -> None:
    """max_tokens below --chunks sends that many content chunks and finishes with length."""
    chunks = await stream_chunks(
        http, openai.url + "/v1/chat/completions", {**STREAM, "max_tokens": 2}
    )
    assert len(chunks) == 1 + 2 + 2
    assert events(chunks[-2])[0]["choices"][0]["finish_reason"] == "length"


async def test_fake_openai_completions_answers_and_streams(
    openai: FakeEngine, http: aiohttp.ClientSession
) -> None:
    """Completions echo the prompt whole, or stream text chunks with usage on the last."""
    url = openai.url + "/v1/completions"
    status, _, body = await post(http, url, {"prompt": "one two three", "max_tokens": 3})
    assert status == 200
    assert body["object"] == "text_completion"
    assert body["choices"][0] == {
        "text": "echo: one two",
        "index": 0,
        "logprobs": None,
        "finish_reason": "length",
    }
    assert body["usage"]["prompt_tokens"] == 3
    chunks = await stream_chunks(http, url, {"prompt": "one two three", "stream": True})
    texts = [events(c)[0]["choices"][0]["text"] for c in chunks[:-1]]
    assert texts == [f"tok{i} " for i in range(CHUNKS)] + [""]
    final = events(chunks[-2])[0]
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["usage"]["completion_tokens"] == CHUNKS
    assert events(chunks[-1]) == ["[DONE]"]


async def test_fake_openai_embeddings_one_vector_per_input(
    openai: FakeEngine, http: aiohttp.ClientSession
) -> None:
    """Embeddings return a list with one deterministic vector per input, in order."""
    url = openai.url + "/v1/embeddings"
    status, _, body = await post(http, url, {"model": "emb", "input": ["a b", "c"]})
    assert status == 200
    assert (body["object"], body["model"]) == ("list", "emb")
    assert [(d["object"], d["index"], len(d["embedding"])) for d in body["data"]] == [
        ("embedding", 0, 8),
        ("embedding", 1, 8),
    ]
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    _, _, again = await post(http, url, {"input": "a b"})
    assert again["data"][0]["embedding"] == body["data"][0]["embedding"]


async def test_fake_openai_health_and_models(
    openai: FakeEngine, http: aiohttp.ClientSession
) -> None:
    """/health says ok and /v1/models lists the one model as llama-server does."""
    async with http.get(openai.url + "/health") as resp:
        assert (resp.status, await resp.json()) == (200, {"status": "ok"})
    async with http.get(openai.url + "/v1/models") as resp:
        models = await resp.json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in models["data"]] == [
        ("echo", "model", "llamacpp"),
    ]


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/chat/completions", b"not json", "the request body must be a JSON object"),
        ("/v1/chat/completions", b'{"model": "echo"}', '"messages" is required'),
        ("/v1/completions", b"{}", '"prompt" is required'),
        ("/v1/embeddings", b"[1]", "the request body must be a JSON object"),
        ("/v1/embeddings", b"{}", '"input" is required'),
    ],
)
async def test_fake_openai_bad_request_uses_llama_error_shape(
    openai: FakeEngine, http: aiohttp.ClientSession, path: str, body: bytes, message: str
) -> None:
    """A body that is not JSON or lacks its input gets 400 in llama-server's error shape."""
    status, ctype, answer = await post(http, openai.url + path, body)
    assert (status, ctype) == (400, "application/json; charset=utf-8")
    assert answer == {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}


async def test_fake_openai_stats_count_and_record_last_request(
    openai: FakeEngine, http: aiohttp.ClientSession
) -> None:
    """/_fake/stats counts requests by path (no total) and keeps the last body and headers;
    reset clears."""
    openai.reset()
    async with http.get(openai.url + "/health"):
        pass
    body = {**CHAT, "cache_prompt": False}
    async with http.post(
        openai.url + "/v1/chat/completions", data=orjson.dumps(body), headers={"X-Probe": "42"}
    ) as resp:
        assert (await resp.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    async with http.get(openai.url + "/health"):
        pass
    stats = openai.stats()
    assert "requests" not in stats  # no total a background probe could move
    assert stats["by_path"] == {"/health": 2, "/v1/chat/completions": 1}
    assert stats["last_body"] == body
    assert stats["last_headers"]["X-Probe"] == "42"
    assert openai.received("/health") == 2 and openai.bodies("/v1/chat/completions") == [body]
    openai.reset()
    assert openai.stats()["by_path"] == {} and openai.received("/health") == 0


def test_fake_refuses_connection_refused() -> None:
    """The announced port refuses TCP connections while the fake runs."""
    with start_fake("fake_refuses") as engine:
        assert engine.alive()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", engine.port), timeout=5).close()


async def test_fake_dies_midstream_exits_after_chunks(http: aiohttp.ClientSession) -> None:
    """With --how exit the stream breaks after the role and --after chunks; the process exits 1."""
    with start_fake("fake_dies_midstream", *FAST, "--after", "2") as engine:
        received = b""
        with pytest.raises(aiohttp.ClientPayloadError):
            async with http.post(
                engine.url + "/v1/chat/completions", data=orjson.dumps(STREAM)
            ) as resp:
                assert resp.status == 200
                async for data, _ in resp.content.iter_chunks():
                    received += data
        contents = [e["choices"][0]["delta"].get("content") for e in events(received)]
        assert contents == [None, "tok0 ", "tok1 "]
        assert engine.proc.wait(timeout=5) == fake_dies_midstream.EXIT_CODE


async def test_fake_dies_midstream_non_stream_closes_without_response(
    http: aiohttp.ClientSession,
) -> None:
    """A non-streamed request sees the connection close with no response at all."""
    with start_fake("fake_dies_midstream", *FAST) as engine:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await post(http, engine.url + "/v1/chat/completions", CHAT)
        assert engine.proc.wait(timeout=5) == fake_dies_midstream.EXIT_CODE


async def test_fake_dies_midstream_abort_keeps_serving(http: aiohttp.ClientSession) -> None:
    """With --how abort each inference connection is cut but the engine keeps serving."""
    with start_fake("fake_dies_midstream", *FAST, "--how", "abort") as engine:
        for _ in range(2):
            with pytest.raises(aiohttp.ClientPayloadError):
                async with http.post(
                    engine.url + "/v1/chat/completions", data=orjson.dumps(STREAM)
                ) as resp:
                    await resp.read()
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await post(http, engine.url + "/v1/chat/completions", CHAT)
        async with http.get(engine.url + "/health") as resp:
            assert resp.status == 200
        assert engine.alive()
        assert engine.stats()["by_path"]["/v1/chat/completions"] == 3


async def test_fake_invalid_json_breaks_body_and_stream(http: aiohttp.ClientSession) -> None:
    """200 JSON answers carry a body that is not JSON; streams carry a data line that is not."""
    with start_fake("fake_invalid_json", *FAST) as engine:
        url = engine.url + "/v1/chat/completions"
        async with http.post(url, data=orjson.dumps(CHAT)) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("application/json")
            raw = await resp.read()
        assert raw == fake_invalid_json.BROKEN_BODY
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(raw)
        chunks = await stream_chunks(http, url, STREAM)
        assert chunks[2] == fake_invalid_json.BROKEN_EVENT
        with pytest.raises(orjson.JSONDecodeError):
            events(chunks[2])
        assert events(chunks[-1]) == ["[DONE]"]
        status, _, body = await post(http, url, b"nope")
        assert status == 400 and body["error"]["type"] == "invalid_request_error"


async def test_fake_hangs_never_sends_headers(http: aiohttp.ClientSession) -> None:
    """An inference request is received but gets no status line; /health still answers."""
    with start_fake("fake_hangs", *FAST) as engine:
        wait = aiohttp.ClientTimeout(total=None, sock_read=0.3)
        with pytest.raises(TimeoutError):
            async with http.post(
                engine.url + "/v1/chat/completions", data=orjson.dumps(CHAT), timeout=wait
            ):
                pass
        assert engine.stats()["by_path"] == {"/v1/chat/completions": 1}
        async with http.get(engine.url + "/health") as resp:
            assert resp.status == 200


async def test_fake_hangs_health_with_flag(http: aiohttp.ClientSession) -> None:
    """With --hang-health even /health never answers."""
    with start_fake("fake_hangs", "--hang-health") as engine:
        wait = aiohttp.ClientTimeout(total=None, sock_read=0.3)
        with pytest.raises(TimeoutError):
            async with http.get(engine.url + "/health", timeout=wait):
                pass
        assert engine.stats()["by_path"] == {"/health": 1}


async def test_fake_openai_load_ms_answers_503_loading(http: aiohttp.ClientSession) -> None:
    """While --load-ms runs, /health and inference answer llama-server's 503 Loading model."""
    loading = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    with start_fake("fake_openai", *FAST, "--load-ms", "600000") as engine:
        async with http.get(engine.url + "/health") as resp:
            assert (resp.status, await resp.json()) == (503, loading)
        status, _, body = await post(http, engine.url + "/v1/chat/completions", CHAT)
        assert (status, body) == (503, loading)
        assert engine.stats()["by_path"] == {"/health": 1, "/v1/chat/completions": 1}


async def test_fake_dies_midstream_completions_counts_content_chunks(
    http: aiohttp.ClientSession,
) -> None:
    """A completions stream (no role chunk) also breaks after exactly --after content chunks."""
    with start_fake("fake_dies_midstream", *FAST, "--after", "2", "--how", "abort") as engine:
        received = b""
        with pytest.raises(aiohttp.ClientPayloadError):
            async with http.post(
                engine.url + "/v1/completions", data=orjson.dumps({"prompt": "x", "stream": True})
            ) as resp:
                async for data, _ in resp.content.iter_chunks():
                    received += data
        assert [e["choices"][0]["text"] for e in events(received)] == ["tok0 ", "tok1 "]


def test_fake_crashes_on_start_reports_exit_and_stderr() -> None:
    """A fake that exits before READY raises FakeStartError with its exit code and stderr."""
    with (
        pytest.raises(FakeStartError, match=r"(?s)exited with code 3.*model loading error"),
        start_fake("fake_crashes_on_start", "--exit-code", "3"),
    ):
        pass


def test_start_fake_unknown_module_fails_clearly() -> None:
    """A fake that exits before READY raises FakeStartError carrying its stderr."""
    with pytest.raises(FakeStartError, match="No module named"), start_fake("fake_nonexistent"):
        pass


def test_start_fake_kills_process_on_exit() -> None:
    """Leaving the block kills the fake, which no longer accepts connections."""
    with start_fake("fake_openai", *FAST) as engine:
        proc = engine.proc
        port = engine.port
    assert proc.poll() is not None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
