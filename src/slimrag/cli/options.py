"""Options several verbs share, checked where click parses them so a bad value is one line that
names the flag and never a traceback.

- :func:`llm_options`: ``--llm URL``, ``--llm-model NAME``, ``--api-key KEY`` (or
  ``OPENAI_API_KEY``), ``--max-tokens N`` and the reuse options for the verbs that generate (ask,
  chat); :func:`llm_spec` turns them into `make_generator`'s arguments.
- :func:`reuse_options`: ``--reuse exact|blend`` and ``--recompute POLICY``, how the embedded
  model reuses passage KV (`slimrag.llm.kv.config.CacheConfig`; ask, chat and serve). They are not
  passed to the command function (``expose_value=False``): their callbacks leave the values in the
  click context (``ctx.meta[REUSE_META]``) and :func:`cache_config` reads them back, so a verb
  gets the flags by its decorator alone and its signature never changes. :func:`llm_spec` adds the
  resulting config as ``cache``.
- :func:`url_option_check`: the callback that refuses a value that is neither an http(s) URL nor a
  registered backend (``--llm``, ``--embedder-url``). It raises a `RequestError` whose message
  starts with the flag (``error: --llm: 'notaurl' is not an http(s) URL ...``, exit code 1, the
  command group's one line for every slimrag error), so a bad URL reads like any other failed
  request rather than a usage message.
- :func:`source_filter`: a ``--source`` value (a stored name, a folder such as ``dpkg``, a path
  as typed, or a glob) as the GLOB the index filters by; a usage error when it matches nothing.
- :func:`config_error`: a config dataclass's ``ValueError`` ("chunk_overlap must be ...") as a
  usage error in the CLI's words ("--chunk-overlap must be ...").
- :func:`non_blank`: the callback of a QUERY or QUESTION argument: an empty or white-space-only
  one is one ``error:`` line (exit status 2), not a search for nothing that returns arbitrary hits.
- :func:`host_options`: ``--allow-host NAME`` and ``--allow-origin ORIGIN`` (repeatable) for the
  three HTTP programs (serve, route, mcp --http); :func:`host_rule` turns them and ``--host``
  into the `HostRule` all three enforce (`slimrag.api.hosts`).
- :func:`bind_port`: the port bound before anything slow runs; one ``error:`` line and exit
  status 2 when it cannot be (in use, not this machine's address, privileged).

Why here and not in each verb: the rules are the same for every verb that takes the flag, and the
library's own checks (`slimrag.openai_http.api_root`, the configs' ``__post_init__``) stay the
source of truth: these only translate their messages into flags.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click

from slimrag.cli.base import GENERATION, Failed
from slimrag.errors import RequestError

F = TypeVar("F", bound=Callable[..., Any])

#: Example URLs shown when a URL is refused: llama-server's and Ollama's OpenAI-compatible roots.
URL_EXAMPLES = "http://127.0.0.1:8080/v1 (llama-server) or http://127.0.0.1:11434/v1 (Ollama)"


def url_option_check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback: ``value`` must be an http(s) URL with a host (or absent); for ``--llm``, a
    spec of another registered backend (`slimrag.llm.backends`) is accepted too."""
    if value is None:
        return None
    value = value.strip()
    parts = urlsplit(value)
    if parts.scheme in ("http", "https") and parts.netloc:
        return value
    if param.name == "llm":
        from slimrag.llm.backends import BACKENDS, backend_kind

        if backend_kind(value) in BACKENDS and backend_kind(value) not in ("http", "https"):
            return value
    flag = max(param.opts, key=len)
    raise RequestError(f"{flag}: {value!r} is not an http(s) URL; give an OpenAI-compatible server's API "
                       f"root such as {URL_EXAMPLES}")


def llm_options(func: F) -> F:
    """Add ``--llm``, ``--llm-model``, ``--api-key`` and ``--max-tokens`` to a command (it receives
    them as ``llm``, ``llm_model``, ``api_key`` and ``max_tokens``), and :func:`reuse_options`."""
    options = [
        click.option("--llm", callback=url_option_check, metavar="URL",
                     help=f"OpenAI-compatible server to generate with, e.g. {URL_EXAMPLES}; "
                          "default: the embedded SmolLM2."),
        click.option("--llm-model", metavar="NAME",
                     help="Model name on the --llm server (e.g. llama3.2 for Ollama); default: the first "
                          "model the server lists."),
        click.option("--api-key", envvar="OPENAI_API_KEY", show_envvar=True, metavar="KEY",
                     help="API key for the --llm server, sent as a bearer token."),
        click.option("--max-tokens", type=click.IntRange(min=1), default=GENERATION["max_new_tokens"],
                      show_default=True, help="Longest answer, in tokens; a cut answer says so."),
    ]
    func = reuse_options(func)  # applied first, so --help lists them after the flags above
    for option in reversed(options):
        func = option(func)
    return func


#: Where the ``--reuse``/``--recompute`` callbacks leave their values in ``click.Context.meta``.
REUSE_META = "slimrag.reuse"
#: The ``--reuse`` choices: `slimrag.llm.kv.config.REUSE_MODES`, spelled out so that parsing a
#: command line does not import the KV package (~0.2 s); a test keeps the two equal.
REUSE_CHOICES = ("exact", "blend")


def _keep_reuse(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """Click callback of ``--reuse``/``--recompute``: check the value and keep it for
    :func:`cache_config` (a recompute policy that does not parse is a bad ``--recompute``)."""
    if value is None:
        return
    if param.name == "recompute":
        from slimrag.llm.kv.recompute import parse_recompute

        try:
            parse_recompute(value)
        except ValueError as e:
            raise click.BadParameter(str(e), ctx=ctx, param=param) from e
    ctx.meta.setdefault(REUSE_META, {})[param.name] = value


def reuse_options(func: F) -> F:
    """Add ``--reuse`` and ``--recompute`` to a command; read them with :func:`cache_config`."""
    options = [
        click.option("--reuse", type=click.Choice(REUSE_CHOICES), expose_value=False, callback=_keep_reuse,
                     help="How the embedded model reuses passage KV across questions: 'exact' (default; "
                          "answers identical to no reuse) or 'blend' (passages reused wherever they stand, "
                          "faster when most passages were seen before, answers may differ)."),
        click.option("--recompute", metavar="POLICY", expose_value=False, callback=_keep_reuse,
                     help="With --reuse blend, which reused tokens are computed again: 'all' (default), "
                          "'none', 'boundary:K' (first K tokens of each passage), 'deviation:R' (the "
                          "fraction R that deviate most), or a union such as 'boundary:8+deviation:0.15'."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def cache_config(llm: str | None = None) -> Any:
    """The `CacheConfig` the current command's ``--reuse``/``--recompute`` ask for, None when
    neither was given (the generator keeps its default). A usage error naming the flag when
    ``--recompute`` comes without ``--reuse blend``, or either comes with an ``--llm`` server
    (which manages its own cache)."""
    ctx = click.get_current_context(silent=True)
    values: dict[str, str] = dict(ctx.meta.get(REUSE_META, {})) if ctx is not None else {}
    if not values:
        return None
    if llm is not None:
        flag = "--reuse" if "reuse" in values else "--recompute"
        raise click.UsageError(f"{flag} configures the embedded model's KV cache; an --llm server manages "
                               "its own: drop one of the two")
    if "recompute" in values and values.get("reuse") != "blend":
        raise click.UsageError("--recompute chooses what blend reuse computes again: give --reuse blend too")
    from dataclasses import replace

    from slimrag.llm.kv.config import PERSISTENT

    try:  # the embedded model's default tier (persistent on disk), with the flags' reuse mode
        return replace(PERSISTENT, **values)
    except ValueError as e:
        raise config_error(e, {"reuse": "--reuse", "recompute": "--recompute"}) from e


def llm_spec(llm: str | None, llm_model: str | None, api_key: str | None) -> dict[str, Any]:
    """The keyword arguments of `make_generator` for the flags; a usage error when a remote-only
    flag comes without ``--llm`` (a key from ``OPENAI_API_KEY`` alone is ignored: it is often set
    for other tools), or a reuse flag with it. ``cache``: the :func:`cache_config`, only when
    ``--reuse`` or ``--recompute`` was given."""
    cache = cache_config(llm)
    if llm is None:
        if llm_model is not None:
            raise click.UsageError("--llm-model names a model on an OpenAI-compatible server: give the "
                                   f"server with --llm too (e.g. {URL_EXAMPLES})")
        if api_key is not None and not _from_environment("api_key"):
            raise click.UsageError("--api-key is for the --llm server: give the server with --llm too")
        return {"llm": None} if cache is None else {"llm": None, "cache": cache}
    return {"llm": llm, "model": llm_model, "api_key": api_key}


def _from_environment(param: str) -> bool:
    """Whether the current command got ``param`` from its environment variable."""
    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source(param) == click.core.ParameterSource.ENVIRONMENT


def config_error(exc: ValueError, flags: Mapping[str, str]) -> click.UsageError:
    """``exc`` (a config class's ``ValueError``) with each field name it mentions replaced by its
    flag (``flags``: field -> flag), as a usage error."""
    message = str(exc)
    for name, flag in sorted(flags.items(), key=lambda kv: -len(kv[0])):
        message = re.sub(rf"\b{re.escape(name)}\b", flag, message)
    return click.UsageError(message)


def source_filter(idx: Any, value: str | None) -> str | None:
    """The ``source`` glob `Index.search` takes for a ``--source`` value (see
    `slimrag.index.sources`); a bad parameter naming ``--source`` when nothing stored matches."""
    if value is None:
        return None
    from slimrag.cli.sources import example_names
    from slimrag.index.sources import source_glob

    names = [d.source for d in idx.documents()]
    pattern = source_glob(value, names, idx.source_root)
    if pattern is None:
        raise click.BadParameter(f"no stored source matches {value!r}; give a stored name, a folder or a glob "
                                 f"(stored names look like {example_names(names)})", param_hint="--source")
    return pattern


def non_blank(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback: refuse an empty or white-space-only argument in one line (exit status 2)."""
    if value is not None and not value.strip():
        name = (param.name or "argument").upper()
        raise Failed(f"{name} is empty or white space only: give some words to search for", exit_code=2)
    return value


def host_options(func: F) -> F:
    """Add ``--allow-host`` and ``--allow-origin`` (received as tuples ``allow_host`` and
    ``allow_origin``); read them with :func:`host_rule`."""
    options = [
        click.option("--allow-host", multiple=True, metavar="NAME[:PORT]",
                     help="Also answer requests whose Host is NAME (a reverse proxy's or the machine's name; any "
                          "port unless given); repeatable. By default only 127.0.0.1, localhost, [::1] and --host "
                          "are answered (others get 421: protection against DNS rebinding); '*' answers any."),
        click.option("--allow-origin", multiple=True, metavar="ORIGIN",
                     help="Also answer browser requests from ORIGIN (scheme://name[:port]); repeatable. Pages "
                          "from other origins get 403; requests without an Origin (curl, SDKs) are not checked."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def host_rule(host: str, allow_host: tuple[str, ...], allow_origin: tuple[str, ...]) -> Any:
    """The `HostRule` for ``--host`` and the two flags of :func:`host_options`; a bad parameter
    naming the flag for a value that does not parse."""
    from slimrag.api.hosts import HostRule, split_authority, split_origin

    for flag, values, check in (("--allow-host", allow_host, split_authority),
                                ("--allow-origin", allow_origin, split_origin)):
        for value in values:
            if value.strip() in ("*", "null") and (flag == "--allow-origin" or value.strip() == "*"):
                continue
            try:
                check(value)
            except ValueError as e:
                raise click.BadParameter(str(e), param_hint=flag) from e
    return HostRule(bind=host, allow_hosts=tuple(allow_host), allow_origins=tuple(allow_origin))


def bind_port(host: str, port: int) -> Any:
    """The socket of ``host``:``port``, bound now, before any model loads (`slimrag.api.listen`);
    one ``error:`` line and exit status 2 when it cannot be bound."""
    from slimrag.api.listen import PortError, bind

    try:
        return bind(host, port)
    except PortError as e:
        raise Failed(str(e), exit_code=2) from e
