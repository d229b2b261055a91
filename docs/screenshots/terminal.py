"""Take docs/screenshots/terminal.png: a real terminal session of `build`, `ask` and `chat`.

The commands run in a detached tmux session (a real terminal: the status line of `ask` and
`chat` is drawn and erased as a user sees it), over the manual-layout pages of
tests/fixtures/manual plus a stylesheet and an SVG figure. The pane is captured with its colours
(``tmux capture-pane -e``), written as HTML by the small SGR converter below, and rendered to PNG
by Debian's chromium, headless. Run from the repository root, with the venv's slimrag on PATH::

    PATH=.venv/bin:$PATH python docs/screenshots/terminal.py

It checks what the README claims: the captured text holds no dependency warning or progress bar.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = Path(__file__).with_name("terminal.png")
SESSION = "slimrag-shot"
COLS, ROWS = 104, 40
#: SGR colour codes of the 16-colour palette (a dark terminal theme).
PALETTE = {30: "#2e3436", 31: "#ef5350", 32: "#8ae234", 33: "#fce94f", 34: "#729fcf", 35: "#ad7fa8",
           36: "#34e2e2", 37: "#d3d7cf", 90: "#888a85", 91: "#ff6e67", 92: "#9ce65c", 93: "#fffb67",
           94: "#8fb8ff", 95: "#d7a6d3", 96: "#6ef0f0", 97: "#ffffff"}
NOISE = re.compile(r"Warning\b|Traceback|site-packages|%\||it/s|Loading weights", re.I)


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def wait_for(last_line_ends: str, count: int = 1, timeout: float = 900) -> None:
    """Until the pane's last line ends with ``last_line_ends`` (a prompt waiting for input) and
    the pane holds it ``count`` times."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [ln.rstrip() for ln in tmux("capture-pane", "-p", "-t", SESSION).splitlines() if ln.strip()]
        if lines and lines[-1].endswith(last_line_ends) and sum(last_line_ends in ln for ln in lines) >= count:
            return
        time.sleep(1)
    raise TimeoutError(f"the session did not come back to {last_line_ends!r}")


def to_html(ansi: str) -> str:
    """The pane's text with its SGR colours and bold as spans; everything else escaped."""
    out, style = [], {"fg": None, "bold": False}
    for piece in re.split(r"(\x1b\[[0-9;]*m)", ansi):
        m = re.fullmatch(r"\x1b\[([0-9;]*)m", piece)
        if m:
            for code in [int(c) for c in (m.group(1) or "0").split(";") if c]:
                if code == 0:
                    style = {"fg": None, "bold": False}
                elif code == 1:
                    style["bold"] = True
                elif code == 22:
                    style["bold"] = False
                elif code == 39:
                    style["fg"] = None
                elif code in PALETTE:
                    style["fg"] = PALETTE[code]
            continue
        if not piece:
            continue
        css = (f"color:{style['fg']};" if style["fg"] else "") + ("font-weight:bold;" if style["bold"] else "")
        out.append(f'<span style="{css}">{html.escape(piece)}</span>' if css else html.escape(piece))
    return ("<!doctype html><meta charset='utf-8'><body style='margin:0;background:#1e1e1e'>"
            "<pre style='margin:0;padding:14px 16px;color:#d3d7cf;font:14px/1.35 \"DejaVu Sans Mono\",monospace;"
            f"white-space:pre'>{''.join(out)}</pre></body>")


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="slimrag-shot-"))
    manual = work / "manual"
    manual.mkdir()
    for page in (REPO / "tests/fixtures/manual").glob("*.html"):
        shutil.copy(page, manual / page.name)
    (manual / "stylesheet.css").write_text("body { font-family: serif; }\n")
    (manual / "figure.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"><text>ferry</text></svg>\n')
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    tmux("new-session", "-d", "-s", SESSION, "-x", str(COLS), "-y", str(ROWS), "-c", str(work),
         "env", "PS1=$ ", "TERM=xterm-256color", "bash", "--norc", "--noprofile")
    try:
        steps = ["slimrag build manual -o manual.slimrag",
                 "slimrag ask manual.slimrag 'How do I build the Ferry client from source?' --max-tokens 60",
                 "slimrag chat manual.slimrag --max-tokens 48"]
        wait_for("$")
        for n, command in enumerate(steps, start=2):
            tmux("send-keys", "-t", SESSION, command, "Enter")
            if command.startswith("slimrag chat"):
                wait_for("you:")
                tmux("send-keys", "-t", SESSION, "What does the btrim function remove?", "Enter")
                wait_for("you:", count=2)
                tmux("send-keys", "-t", SESSION, "", "Enter")  # an empty line ends the chat
            wait_for("$", count=n)
        ansi = tmux("capture-pane", "-p", "-e", "-J", "-t", SESSION)  # -J: wrapped lines joined
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", ansi)
    noise = [ln for ln in plain.splitlines() if NOISE.search(ln)]
    if noise:
        print("dependency output in the session:\n" + "\n".join(noise), file=sys.stderr)
        return 1
    page = work / "terminal.html"
    page.write_text(to_html(ansi.rstrip() + "\n"))
    lines = plain.rstrip().splitlines()
    width, height = 40 + int(8.5 * max(map(len, lines))), 32 + 19 * len(lines)
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={OUT}", f"--window-size={width},{height}", page.as_uri()],
                   check=True, capture_output=True)
    print(plain.rstrip())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
