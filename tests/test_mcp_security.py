"""What an MCP client may make ``slimrag mcp`` read, and who may talk to it over HTTP (issue 27).

Ground truth is the file system and the wire: real folders with real symlinks and hidden files in
``tmp_path``, the real ``slimrag mcp`` command in a subprocess driven by the SDK's own client over
stdio and streamable HTTP, and raw HTTP (httpx, a plain socket) on 127.0.0.1 for what a hostile
client sends: no key, a wrong key, a 10 MiB body, one session too many. Each server stops when its
test leaves (stdio: the client closes it; HTTP: terminated in ``finally``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from click.testing import CliRunner
from conftest import write_tree
from mcp import ClientSession
from test_mcp import CLI, ENV, SESSION_LIMIT_S, _free_port, error_text, run_stdio, structured, wait_listening

from slimrag.cli import cli
from slimrag.index.core import Index
from slimrag.ingest.confine import AddRefused, AddRoots
from slimrag.ingest.crawl import crawl
from slimrag.ingest.outcome import IGNORED, OUTSIDE, Skipped

SECRET = "OPENSSH PRIVATE KEY zebra-platypus-7731"
KEY = "s3cret-mcp-key"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An indexed folder with every way out of it, a secret folder beside it, and an extra folder
    that only ``--allow-add`` opens:

    docs/guide.md, docs/new.md (not yet indexed), docs/.hidden.md, docs/.ssh/id_rsa,
    docs/out.md -> secret/key.txt, docs/outdir -> secret/, docs/inner.md -> docs/guide.md,
    docs/sub/peek.md -> docs/.hidden.md; secret/key.txt; extra/owl.md."""
    base = tmp_path_factory.mktemp("confine")
    secret = write_tree(base / "secret", {"key.txt": f"-----BEGIN {SECRET}-----"})
    docs = write_tree(base / "docs", {"guide.md": "# Cats\n\nThe office cat is called Whiskers.",
                                      ".hidden.md": f"hidden {SECRET}", ".ssh/id_rsa": f"{SECRET} in ssh"})
    extra = write_tree(base / "extra", {"owl.md": "# Owls\n\nThe barn owl hunts voles at night."})
    (docs / "out.md").symlink_to(secret / "key.txt")
    (docs / "outdir").symlink_to(secret, target_is_directory=True)
    (docs / "inner.md").symlink_to(docs / "guide.md")
    (docs / "sub").mkdir()
    (docs / "sub" / "peek.md").symlink_to(docs / ".hidden.md")
    return {"base": base, "docs": docs, "secret": secret, "extra": extra, "index": base / "idx"}


# --- the rule itself (`AddRoots`), no server ---------------------------------------------------

def test_paths_inside_the_root_are_their_real_paths(tree: dict[str, Path]) -> None:
    docs = tree["docs"]
    roots = AddRoots.of([docs])
    assert roots.check(str(docs / "guide.md")) == docs / "guide.md"
    assert roots.check("guide.md") == docs / "guide.md"  # relative: to the indexed folder, not the cwd
    assert roots.check(str(docs / "sub" / ".." / "guide.md")) == docs / "guide.md"
    assert roots.check(str(docs / "inner.md")) == docs / "guide.md"  # a link that stays inside
    assert roots.check(str(docs)) == docs


@pytest.mark.parametrize("given", [
    "{secret}/key.txt",          # outside, absolute
    "../secret/key.txt",         # outside, relative
    "{docs}/../secret/key.txt",  # outside through ..
    "{docs}/out.md",             # a symlink inside that points outside
    "{docs}/outdir/key.txt",     # through a symlinked folder that points outside
    "{docs}/outdir",
    "/",
    "~",
    "~/.ssh",
])
def test_paths_outside_the_root_are_refused(tree: dict[str, Path], given: str) -> None:
    roots = AddRoots.of([tree["docs"]])
    with pytest.raises(AddRefused, match="outside the allowed folders.*--allow-add PATH"):
        roots.check(given.format(**tree))


@pytest.mark.parametrize("given", ["{docs}/.hidden.md", ".hidden.md", "{docs}/.ssh/id_rsa", "{docs}/.ssh",
                                   "{docs}/sub/peek.md"])  # the last: a visible link to a hidden file
def test_hidden_files_named_directly_are_refused(tree: dict[str, Path], given: str) -> None:
    with pytest.raises(AddRefused, match="hidden file or folder"):
        AddRoots.of([tree["docs"]]).check(given.format(**tree))


@pytest.mark.parametrize("given", ["", "  ", "guide.md\x00../../secret/key.txt"])
def test_what_is_no_path_is_refused(tree: dict[str, Path], given: str) -> None:
    with pytest.raises(AddRefused, match="is not a path"):
        AddRoots.of([tree["docs"]]).check(given)


def test_a_refusal_does_not_say_whether_an_outside_path_exists(tree: dict[str, Path]) -> None:
    roots = AddRoots.of([tree["docs"]])
    for given in (tree["secret"] / "key.txt", tree["secret"] / "nothing.txt"):
        with pytest.raises(AddRefused, match="outside the allowed folders") as exc:
            roots.check(given)
        assert "no such" not in str(exc.value)
    with pytest.raises(AddRefused, match="no such file or folder"):
        roots.check("missing.md")  # inside a root, existence may be told


def test_allow_add_widens_the_roots_and_nothing_else(tree: dict[str, Path]) -> None:
    narrow = AddRoots.of([tree["docs"]])
    wide = AddRoots.of([tree["docs"], tree["extra"]])
    with pytest.raises(AddRefused):
        narrow.check(tree["extra"] / "owl.md")
    assert wide.check(tree["extra"] / "owl.md") == tree["extra"] / "owl.md"
    with pytest.raises(AddRefused):
        wide.check(tree["secret"] / "key.txt")


def test_no_roots_refuses_everything_and_the_index_folder_is_never_a_document(tree: dict[str, Path]) -> None:
    with pytest.raises(AddRefused, match="no folder is open"):
        AddRoots.of([None]).check(tree["docs"] / "guide.md")
    index = tree["docs"] / "idx"
    index.mkdir(exist_ok=True)
    with pytest.raises(AddRefused, match="index's own folder"):
        AddRoots.of([tree["docs"]], index=index).check(index)
    index.rmdir()


def test_a_root_that_is_a_symlink_means_its_target(tree: dict[str, Path], tmp_path: Path) -> None:
    link = tmp_path / "link-to-docs"
    link.symlink_to(tree["docs"], target_is_directory=True)
    roots = AddRoots.of([link])
    assert roots.roots == (tree["docs"],)
    assert roots.check(str(link / "guide.md")) == tree["docs"] / "guide.md"


def test_check_all_names_every_refused_path(tree: dict[str, Path]) -> None:
    with pytest.raises(AddRefused, match=r"2 paths refused: .*key\.txt.*\.hidden\.md"):
        AddRoots.of([tree["docs"]]).check_all(["guide.md", str(tree["secret"] / "key.txt"), ".hidden.md"])


def test_files_of_a_folder_stay_inside_and_visible(tree: dict[str, Path]) -> None:
    """`AddRoots.files`: the crawl lets a visible link reach a hidden file inside the folder
    (sub/peek.md -> .hidden.md); the second check skips it, and links out, with a reason."""
    skipped: list[Skipped] = []
    files = AddRoots.of([tree["docs"]]).files([str(tree["docs"])], (), 1 << 20, skipped)
    assert tree["docs"] / "guide.md" in files
    assert not any(SECRET in p.read_text() for p in files)
    assert all(not any(part.startswith(".") for part in p.relative_to(tree["docs"]).parts) for p in files)
    kinds = {s.source: s.kind for s in skipped}
    assert kinds["sub/peek.md"] == IGNORED and "hidden" in next(s.reason for s in skipped if s.source == "sub/peek.md")
    assert kinds["out.md"] == kinds["outdir"] == OUTSIDE


def test_a_walked_folder_never_follows_a_symlink_out(tree: dict[str, Path]) -> None:
    """The crawl behind an allowed folder: links out of it are skipped with a reason, so nothing
    under secret/ is found. (It does follow sub/peek.md to .hidden.md, inside the folder: that
    is why `AddRoots.files` checks each found file again.)"""
    skipped: list[Skipped] = []
    found = {f.source: f.path for f in crawl(tree["docs"], skipped=skipped)}
    assert all(p.resolve().is_relative_to(tree["docs"]) for p in found.values())
    assert "guide.md" in found and ".hidden.md" not in found and ".ssh/id_rsa" not in found
    assert not any(p.resolve().is_relative_to(tree["secret"]) for p in found.values())
    assert {s.source for s in skipped if s.kind == OUTSIDE} == {"out.md", "outdir"}


# --- the CLI refuses to start -----------------------------------------------------------------

def test_cli_defaults_are_the_limits_defaults() -> None:
    from slimrag.mcp.http import HttpLimits

    params = {p.name: p.default for p in cli.commands["mcp"].params}
    assert (params["max_sessions"], params["session_idle"]) == (HttpLimits().max_sessions,
                                                                HttpLimits().session_idle_s)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "box.lan"])
def test_http_beyond_loopback_without_a_key_refuses_to_start(tree: dict[str, Path], host: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLIMRAG_MCP_KEY", raising=False)
    res = CliRunner().invoke(cli, ["mcp", str(tree["docs"]), "--http", "--host", host, "--port", "0"])
    assert res.exit_code == 2, res.output
    assert f"refusing to serve MCP on {host} without a key" in res.output and "--key" in res.output


def test_key_flags_are_checked(tree: dict[str, Path]) -> None:
    res = CliRunner().invoke(cli, ["mcp", str(tree["docs"]), "--key", KEY])
    assert res.exit_code == 2 and "--key applies only with --http" in res.output
    res = CliRunner().invoke(cli, ["mcp", str(tree["docs"]), "--http", "--key", " padded "])
    assert res.exit_code == 2 and "white space" in res.output


def test_the_library_refuses_too(tree: dict[str, Path]) -> None:
    from slimrag.mcp.http import HttpLimits
    from slimrag.mcp.server import serve

    with pytest.raises(ValueError, match="without a key"):  # before the index is opened
        serve(tree["docs"], transport="streamable-http", host="0.0.0.0")
    with pytest.raises(ValueError, match="max_sessions"):
        HttpLimits(max_sessions=0)


# --- over stdio ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def index(tree: dict[str, Path], embedder: Any) -> Path:
    """The index of docs/ (built from the folder, so its indexed folder is docs/). Built without
    sub/peek.md: the build's own crawl follows that visible link to the hidden file (a crawl
    matter, not the server's), and these tests must see what the server adds."""
    peek = tree["docs"] / "sub" / "peek.md"
    peek.unlink()
    Index.build(tree["docs"], tree["index"], embedder=embedder).close()
    peek.symlink_to(tree["docs"] / ".hidden.md")
    (tree["docs"] / "new.md").write_text("# Quokkas\n\nA quokka smiled at the ferry passengers.")
    return tree["index"]


def test_stdio_add_paths_is_confined(tree: dict[str, Path], index: Path) -> None:
    docs, secret = tree["docs"], tree["secret"]
    hostile = {"outside": [str(secret / "key.txt")], "relative": ["../secret/key.txt"],
               "link_out": [str(docs / "out.md")], "hidden": [str(docs / ".hidden.md")],
               "hidden_dir": [str(docs / ".ssh")], "home": ["~/.ssh"], "mixed": ["new.md", str(secret)]}

    async def scenario(s: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {"tool": next(t for t in (await s.list_tools()).tools if t.name == "add_paths")}
        out.update({name: await s.call_tool("add_paths", {"paths": paths}) for name, paths in hostile.items()})
        out["sub"] = await s.call_tool("add_paths", {"paths": ["sub"]})  # only a link out of sub/, nothing read
        out["docs"] = await s.call_tool("add_paths", {"paths": [str(docs)]})
        out["extra"] = await s.call_tool("add_paths", {"paths": [str(tree["extra"] / "owl.md")]})
        out["secret"] = await s.call_tool("search", {"query": "OPENSSH PRIVATE KEY zebra", "mode": "keyword"})
        out["owl"] = await s.call_tool("search", {"query": "voles", "mode": "keyword"})
        return out

    got = run_stdio(index, scenario, "--allow-add", str(tree["extra"]))
    tool = got["tool"]
    assert str(docs) in tool.description and str(tree["extra"]) in tool.description and "hidden" in tool.description
    hints = tool.annotations
    assert (hints.read_only_hint, hints.destructive_hint, hints.open_world_hint) == (False, True, True)
    for name in hostile:
        text = error_text(got[name])  # a tool error, and the session goes on
        assert "--allow-add PATH" in text, (name, text)
    assert "hidden" in error_text(got["hidden"]) and "hidden" in error_text(got["hidden_dir"])
    sub = structured(got["sub"])
    assert (sub["added"], [(s["source"], s["kind"]) for s in sub["skipped"]]) == (0, [("peek.md", OUTSIDE)])
    added = structured(got["docs"])
    assert sorted(added["files"]["added"]) == ["new.md"]  # out.md, outdir, .hidden.md: never read
    assert {s["source"] for s in added["skipped"] if s["kind"] == OUTSIDE} >= {"out.md", "outdir"}
    assert "sub/peek.md" in {s["source"] for s in added["skipped"] if s["kind"] == IGNORED}
    assert structured(got["extra"])["added"] == 1  # --allow-add opens extra/
    assert structured(got["secret"])["hits"] == []
    assert "voles" in structured(got["owl"])["hits"][0]["text"]


# --- over HTTP ----------------------------------------------------------------------------------

@pytest.fixture
def http_server(index: Path) -> Iterator[str]:
    """``slimrag mcp INDEX --http`` on a free 127.0.0.1 port, its key from ``SLIMRAG_MCP_KEY``,
    at most 3 sessions idle 2 s at most; yields the /mcp URL; terminated on exit."""
    port = _free_port()
    proc = subprocess.Popen([*CLI, str(index), "--http", "--port", str(port), "--max-sessions", "3",
                             "--session-idle", "2"], env={**ENV, "SLIMRAG_MCP_KEY": KEY},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(proc, port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def initialize(url: str, key: str | None, authorization: str | None = None) -> httpx.Response:
    """One raw ``initialize`` POST (what opens a session), with ``key`` as a Bearer token (or the
    ``authorization`` header value as given)."""
    if authorization is None and key is not None:
        authorization = f"Bearer {key}"
    headers = {**ACCEPT, **({"authorization": authorization} if authorization is not None else {})}
    with httpx.Client(timeout=30) as client:
        return client.post(url, content=json.dumps(INIT), headers=headers)


def test_http_calls_without_the_key_get_401_and_open_no_session(http_server: str) -> None:
    for key in (None, "wrong", KEY.upper()):
        res = initialize(http_server, key)
        assert res.status_code == 401 and res.headers["www-authenticate"] == "Bearer", res.text
        assert "mcp-session-id" not in res.headers and "Authorization: Bearer KEY" in res.json()["error"]["message"]
    with httpx.Client(timeout=30) as client:  # every method and path, not only initialize
        assert client.get(http_server).status_code == 401
        assert client.delete(http_server).status_code == 401
        assert client.get(http_server.replace("/mcp", "/other")).status_code == 401
    for _ in range(5):  # refused requests, more than the cap: none of them took a session
        assert initialize(http_server, "wrong").status_code == 401
    opened = [initialize(http_server, KEY) for _ in range(3)]
    assert [r.status_code for r in opened] == [200] * 3, [r.text for r in opened]
    assert len({r.headers["mcp-session-id"] for r in opened}) == 3
    assert initialize(http_server, None, f"bearer   {KEY}").status_code == 503  # scheme any case; the cap holds


def test_http_session_cap_and_idle_expiry(http_server: str) -> None:
    opened = [initialize(http_server, KEY) for _ in range(3)]
    assert all(r.status_code == 200 for r in opened)
    full = initialize(http_server, KEY)
    assert full.status_code == 503 and "Too many open sessions" in full.text
    time.sleep(3.5)  # past the 2 s idle limit: the three sessions are closed
    with httpx.Client(timeout=30) as client:
        gone = client.post(http_server, content=json.dumps({**INIT, "id": 2, "method": "ping"}),
                           headers={**ACCEPT, "authorization": f"Bearer {KEY}",
                                    "mcp-session-id": opened[0].headers["mcp-session-id"]})
    assert gone.status_code == 404
    assert initialize(http_server, KEY).status_code == 200


def _raw(port: int, head: str, body: bytes) -> bytes:
    """Send ``head`` and ``body`` on a fresh socket and read the answer until the server closes
    it or 10 s pass; the body is sent as it is, whatever the head declares."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode() + b"\r\n\r\n" + body)
        got = b""
        try:
            while b"\r\n\r\n" not in got or len(got) < 64:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except TimeoutError:
            pass
    return got


def test_http_big_bodies_get_413_without_being_read(http_server: str) -> None:
    port = int(http_server.rsplit(":", 1)[1].split("/")[0])
    base = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\n")
    # 10 MiB declared, 1 KiB sent: the answer comes before the body, so none of it was waited for
    start = time.monotonic()
    answer = _raw(port, base + f"Authorization: Bearer {KEY}\r\nContent-Length: {10 << 20}", b"x" * 1024)
    assert answer.startswith(b"HTTP/1.1 413") and time.monotonic() - start < 5, answer[:200]
    # chunked, no length declared: refused once 1 MiB has arrived, while the client still sends
    piece = b"x" * 65536
    chunks = (b"%x\r\n" % len(piece) + piece + b"\r\n") * 17  # 1.06 MiB, the final chunk never sent
    answer = _raw(port, base + f"Authorization: Bearer {KEY}\r\nTransfer-Encoding: chunked", chunks)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # without the key, a big body is refused by the key check, before anything is read
    answer = _raw(port, base + f"Content-Length: {10 << 20}", b"")
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


def test_http_add_paths_is_confined_for_an_authenticated_client(http_server: str, tree: dict[str, Path]) -> None:
    import httpx2  # the SDK's HTTP client
    from mcp.client.streamable_http import streamable_http_client

    async def main() -> dict[str, Any]:
        with anyio.fail_after(SESSION_LIMIT_S):
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as http, \
                    streamable_http_client(http_server, http_client=http) as (read, write), \
                    ClientSession(read, write) as s:
                await s.initialize()
                call = s.call_tool
                return {"outside": await call("add_paths", {"paths": [str(tree["secret"] / "key.txt")]}),
                        "link_out": await call("add_paths", {"paths": [str(tree["docs"] / "out.md")]}),
                        "hidden": await call("add_paths", {"paths": [str(tree["docs"] / ".ssh" / "id_rsa")]}),
                        "extra": await call("add_paths", {"paths": [str(tree["extra"])]}),  # no --allow-add here
                        "inside": await call("add_paths", {"paths": ["guide.md"]}),
                        "search": await call("search", {"query": "zebra-platypus-7731", "mode": "keyword"})}

    got = anyio.run(main)
    for name in ("outside", "link_out", "extra"):
        assert "outside the allowed folders" in error_text(got[name]), name
    assert "hidden" in error_text(got["hidden"])
    assert structured(got["inside"])["unchanged"] == 1
    assert structured(got["search"])["hits"] == []
    assert not os.environ.get("SLIMRAG_MCP_KEY")  # the key went to the server only
