"""Keep the libraries slimrag runs on off the user's screen: their warnings, progress bars and
log lines, so that what a command prints is slimrag's own (its progress, answers and messages).

Why in one place, at the CLI's entry
    The noise comes from libraries several layers down (a ``FutureWarning`` raised inside torch's
    module call while transformers runs a model, a "Loading weights" tqdm bar, uvicorn's access
    log on stdout, Ray's start-up lines), and it lands in the middle of an answer or breaks
    ``chat``'s status line. Each of those libraries reads its switches when it is first imported,
    so `quiet_dependencies` runs from the command group's callback, before any verb imports
    them (the verbs import the heavy libraries lazily, inside their functions). The library API
    (``import slimrag``) changes nothing global: a program that embeds slimrag keeps its own
    warning and logging policy.

What it sets (only where the user has not set it: an exported value always wins)
    ``HF_HUB_DISABLE_PROGRESS_BARS=1``: huggingface_hub's bars, and through it transformers'
    ("Loading weights: 100%"), which reads the same switch at import.
    ``TRANSFORMERS_VERBOSITY=error`` and ``TRANSFORMERS_NO_ADVISORY_WARNINGS=1``: transformers'
    own logger and its one-time advice. ``TQDM_DISABLE=1``: every tqdm bar (transformers' GGUF
conversion uses tqdm directly; slimrag draws its own progress, not with tqdm).
``TOKENIZERS_PARALLELISM=false``: the tokenizers library's
    "process just got forked" notice. ``RAY_DATA_DISABLE_PROGRESS_BARS=1`` and
    ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0`` (Ray's FutureWarning about it at start-up).
    Python warnings: ignored, except those raised from slimrag's own modules. Loggers of the
    libraries in `LIBRARIES`: ERROR and above only. uvicorn configures its loggers itself when a
    server starts (it resets their level), so they get a filter instead, which uvicorn keeps:
    errors still show, the access log and start-up lines do not.

The debugging switch
    ``slimrag -v``, or ``SLIMRAG_LOG=LEVEL`` (debug, info, warning...) in the environment, leaves
    everything as the libraries have it, and sets that level (INFO for ``-v``) on their loggers.
    ``PYTHONWARNINGS`` set in the environment keeps Python's own warning filters (the ones it
    names), so ``PYTHONWARNINGS=default slimrag ask ...`` shows every warning again.
"""

from __future__ import annotations

import logging
import os
import warnings

#: Environment switches the libraries read at import, with the value that silences them.
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TQDM_DISABLE": "1",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}

#: Loggers of the libraries slimrag runs on (their children follow them). Not pypdf nor trafilatura:
#: the readers set those (`slimrag.ingest`), since slimrag reports the files they fail on itself.
LIBRARIES = ("transformers", "torch", "sentence_transformers", "huggingface_hub", "onnxruntime", "optimum",
             "accelerate", "datasets", "filelock", "urllib3", "httpx", "httpcore", "ray", "gguf", "htmldate",
             "courlan", "justext", "uvicorn", "mcp", "fastapi", "starlette", "asyncio", "multipart")

#: uvicorn's loggers: it re-levels them when a server starts, so they are filtered instead.
SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


class _ErrorsOnly(logging.Filter):
    """Lets through records of ERROR and above (a logger-level filter survives uvicorn's dictConfig)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


_FILTER = _ErrorsOnly()


def debug_level(verbose: bool) -> int | None:
    """The log level the user asked the libraries to speak at (``-v``: INFO; ``SLIMRAG_LOG``: its
    level), or None when they should be quiet. An unknown ``SLIMRAG_LOG`` value means DEBUG."""
    wanted = os.environ.get("SLIMRAG_LOG", "").strip()
    if wanted:
        level = logging.getLevelName(wanted.upper())
        return level if isinstance(level, int) else logging.DEBUG
    return logging.INFO if verbose else None


def quiet_dependencies(verbose: bool = False) -> None:
    """Silence the libraries' warnings, bars and logs for this process, unless the user asked for
    them (see the module header). Safe to call more than once."""
    level = debug_level(verbose)
    if level is not None:
        for name in (*LIBRARIES, *SERVER_LOGGERS):
            logging.getLogger(name).setLevel(level)
            logging.getLogger(name).removeFilter(_FILTER)
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if not os.environ.get("PYTHONWARNINGS"):
        warnings.simplefilter("ignore")
        warnings.filterwarnings("default", module=r"slimrag(\.|$)")
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(logging.ERROR)
    for name in SERVER_LOGGERS:
        logging.getLogger(name).addFilter(_FILTER)
    _quiet_loaded_libraries()


def _quiet_loaded_libraries() -> None:
    """Libraries imported before the callback ran (a test process, ``python -c``) read their
    switches already: tell them directly. Nothing is imported here."""
    import sys

    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
