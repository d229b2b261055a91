"""Readers of e-mail: one message (``.eml``) and mailboxes (``.mbox``), with the standard library's
`email` package (``policy.default``: RFC 2047 headers decoded, charsets honoured).

One section per message, headed ``subject · from · date`` so a passage says which mail it came
from; its text starts with the From, To, Date and Subject lines (a question about who wrote what
finds them), then the body. The plain-text body is preferred; a message with only an HTML body
is read through the HTML reader (`slimrag.ingest.html.page_sections`), so no markup reaches the
index. Attachments are skipped: `EmailMessage.get_body` never picks a part marked as one, and
their bytes are neither decoded nor read. A body in a charset Python does not know is decoded as
UTF-8 with replacement characters, so one odd message does not lose the mailbox. For the same
reason, when the standard library's modern header parser fails on a malformed header (it raises
AttributeError or IndexError on about 1 in 100 fuzzed messages, CPython bugs rather than
refusals), that header is shown as written and the body is found by the legacy ``compat32``
parser, which keeps headers as strings: the message is still indexed.

An mbox is split here, not with `mailbox.mbox` (which needs a file on disk, and the reader has
the bytes, perhaps decompressed from ``.mbox.gz``), by the same rule `mailbox.mbox` reads with:
a message starts at each line beginning ``From `` (body lines that began so were written as
``>From `` by the mail program, and are kept as they are, as `mailbox` does). A file whose first
line is not such a line is not an mbox: a parse error. Data with NUL bytes is binary, refused.

`email` is imported on first use: ``email.policy`` alone takes tens of milliseconds to import.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from slimrag.ingest.html import page_sections
from slimrag.ingest.outcome import BINARY, PARSE_ERROR, SkipFile
from slimrag.ingest.rawfile import SNIFF_BYTES
from slimrag.ingest.text import Section

if TYPE_CHECKING:
    from email.message import EmailMessage

#: header lines written at the top of a message's text, in this order
HEADERS = ("From", "To", "Cc", "Date", "Subject")


def _refuse_binary(data: bytes) -> None:
    if b"\x00" in data[:SNIFF_BYTES]:
        raise SkipFile(BINARY, f"NUL bytes in the first {SNIFF_BYTES // 1024} KB")


#: what `email`'s policy.default parser raises on some malformed headers (see the module header)
_PARSER_BUGS = (AttributeError, IndexError, KeyError, TypeError, ValueError)


def _content(part: EmailMessage) -> str:
    """A text part decoded with its declared charset (UTF-8 with replacement for an unknown one)."""
    try:
        return str(part.get_content())
    except (LookupError, UnicodeError):  # an unknown or lying charset
        payload = part.get_payload(decode=True)
        return payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""


def body_text(msg: EmailMessage) -> str:
    """The message's body: its plain-text part, else its HTML part as text, else empty."""
    part = msg.get_body(preferencelist=("plain", "html"))
    if part is None:
        return ""
    content = _content(part)  # type: ignore[arg-type]  # get_body returns the message's own class
    if part.get_content_subtype() == "html":
        return "\n\n".join(s.text for s in page_sections(content))
    return content.strip()


def legacy_body_text(raw: bytes) -> str:
    """The text/plain parts that are not attachments, found by the ``compat32`` parser (headers kept
    as strings): the fallback of `body_text` when the modern parser fails."""
    from email import message_from_bytes

    texts = []
    for part in message_from_bytes(raw).walk():
        if part.get_content_type() != "text/plain" or part.get_filename() is not None:
            continue
        payload = part.get_payload(decode=True)
        if isinstance(payload, bytes):
            charset = part.get_content_charset() or "utf-8"
            try:
                texts.append(payload.decode(charset, "replace"))
            except LookupError:
                texts.append(payload.decode("utf-8", "replace"))
    return "\n\n".join(t.strip() for t in texts if t.strip())


def _header(msg: EmailMessage, name: str) -> str:
    """A header's value on one line: decoded, or as written when the parser fails on it."""
    try:
        value = str(msg.get(name, ""))
    except _PARSER_BUGS:
        value = next((str(v) for k, v in msg.raw_items() if k.lower() == name.lower()), "")
    return " ".join(value.split())


def message_section(raw: bytes) -> Section | None:
    """The section of one message's bytes (see the module header); None when it has no text."""
    from email import message_from_bytes, policy  # email.policy costs ~50 ms to import: not at startup

    msg: EmailMessage = message_from_bytes(raw, policy=policy.default)  # type: ignore[assignment]
    heads = {name: _header(msg, name) for name in HEADERS}
    lines = [f"{name}: {value}" for name, value in heads.items() if value]
    try:
        body = body_text(msg)
    except _PARSER_BUGS:  # a Content-Type or Content-Disposition the modern parser trips on
        body = legacy_body_text(raw)
    if not body and not lines:
        return None
    heading = " · ".join(v for v in (heads["Subject"] or "(no subject)", heads["From"], heads["Date"]) if v)
    return Section(heading, "\n".join(lines) + ("\n\n" + body if body else ""))


def read_eml(data: bytes, path: Path) -> list[Section]:
    """One e-mail message (RFC 5322, as saved by mail programs)."""
    _refuse_binary(data)
    section = message_section(data)
    return [section] if section is not None else []


def mbox_messages(data: bytes) -> Iterator[bytes]:
    """The raw messages of an mbox, each without its ``From `` separator line; raises `SkipFile`
    when the data does not start with one. Linear: one scan for ``\\nFrom ``."""
    start = len(data) - len(data.lstrip(b"\r\n"))
    if not data.startswith(b"From ", start):
        raise SkipFile(PARSE_ERROR, "not an mbox: it does not start with a 'From ' line")
    while start < len(data):
        body = data.find(b"\n", start)
        if body < 0:
            return
        nxt = data.find(b"\nFrom ", body)
        end = len(data) if nxt < 0 else nxt + 1
        yield data[body + 1:end]
        start = end


def read_mbox(data: bytes, path: Path) -> list[Section]:
    """A mailbox: one section per message, in file order."""
    _refuse_binary(data)
    return [s for raw in mbox_messages(data) if raw.strip() and (s := message_section(raw)) is not None]
