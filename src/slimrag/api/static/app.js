// The web page of `slimrag serve`: plain JavaScript, no framework, no build step, no third-party
// code. It talks only to this server: POST /v1/chat/completions (streamed server-sent events; the
// last event's `slimrag` field lists the sources), POST /v1/search, GET /v1/status and
// GET /v1/passages/{chunk_id}. Text from the server is always set with textContent, never parsed
// as HTML: answers go through markdown.js (loaded first), which builds DOM nodes from Markdown and
// shows raw HTML as text; passages and snippets are plain text. With an API key on the server, the first 401 opens a dialog; the key is kept in this
// tab's sessionStorage and sent as a bearer token.
"use strict";

const KEY_STORE = "slimrag-api-key";
const $ = (id) => document.getElementById(id);

/** The conversation so far, as OpenAI messages: sent whole with each question (multi-turn). */
const conversation = [];
/** Bumped by "New conversation", so an answer still streaming is not added to the new one. */
let conversationId = 0;
/** The evidence sentences the open passage highlights: those of the answer whose citation opened it
 * (the `slimrag.evidence` field), none for a search hit. */
let highlighted = [];

class ApiError extends Error {}

// -- the API key ------------------------------------------------------------------------------
let keyPrompt = null;

/** Ask for the key in the dialog (one dialog for every request that got 401 meanwhile). */
function askKey(refused) {
  if (keyPrompt) return keyPrompt;
  keyPrompt = new Promise((resolve) => {
    const dialog = $("key-dialog");
    $("key-why").textContent = refused
      ? "The server refused that key. Enter the key it was started with."
      : "This server needs its API key. The page keeps it in this tab only (sessionStorage).";
    $("api-key").value = "";
    dialog.returnValue = "";
    dialog.addEventListener("close", () => {
      keyPrompt = null;
      const key = $("api-key").value.trim();
      resolve(dialog.returnValue === "ok" && key ? key : null);
    }, { once: true });
    dialog.showModal();
  });
  return keyPrompt;
}

/** fetch() on this server with the key; on 401, ask for the key and try again. */
async function api(path, init = {}) {
  for (;;) {
    const used = sessionStorage.getItem(KEY_STORE);
    const headers = new Headers(init.headers || {});
    if (used) headers.set("Authorization", `Bearer ${used}`);
    const res = await fetch(path, { ...init, headers });
    if (res.status !== 401) {
      if (!res.ok) throw new ApiError(await errorMessage(res));
      return res;
    }
    if (sessionStorage.getItem(KEY_STORE) !== used) continue; // a key was entered meanwhile
    const key = await askKey(used !== null);
    if (!key) throw new ApiError("This server needs its API key; reload the page to enter it.");
    sessionStorage.setItem(KEY_STORE, key);
  }
}

async function errorMessage(res) {
  try {
    const body = await res.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (_) {
    // not JSON: fall back to the status line below
  }
  return `${res.status} ${res.statusText}`;
}

function postJSON(path, body) {
  return api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
}

/** The decoded `data:` events of a server-sent event stream ("[DONE]" as a string). */
async function* sseEvents(res) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
    const blocks = buffer.split(/\r?\n\r?\n/);
    buffer = done ? "" : blocks.pop();
    for (const block of blocks) {
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data) yield data === "[DONE]" ? data : JSON.parse(data);
    }
    if (done) return;
  }
}

// -- small DOM helpers ------------------------------------------------------------------------
function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("aria-") || k === "role") node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function showError(id, message) {
  const node = $(id);
  node.textContent = message || "";
  node.hidden = !message;
}

function formatBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

const seconds = (s) => `${Number(s).toFixed(2)} s`;

/** A hit's page (PDFs): the server's `page`, else the chunk metadata's. */
function pageOf(hit) {
  if (Number.isInteger(hit.page) && hit.page > 0) return hit.page;
  const meta = hit.metadata || {};
  return Number.isInteger(meta.page) && meta.page > 0 ? meta.page : null;
}

/** A button that opens a chunk's passage, labelled as answers cite it (source#ordinal); `evidence`:
 * the answer's evidence sentences, highlighted in the passage. */
function citeButton(hit, text = hit.label, evidence = []) {
  return el("button", { type: "button", class: "cite", dataset: { chunkId: String(hit.chunk_id) },
    title: `Show ${hit.label} in its document`, onclick: () => showPassage(hit.chunk_id, evidence) }, text);
}

function sourceItem(hit, used, evidence = []) {
  const page = pageOf(hit);
  return el("li", { class: used === false ? "also-retrieved" : "" }, citeButton(hit, hit.label, evidence), " ",
    el("span", { class: "path" }, hit.source), page ? el("span", { class: "page" }, ` · page ${page}`) : null,
    used === false ? el("span", { class: "why" }, " · also retrieved, no answer sentence matches it") : null);
}

/** One evidence sentence: quoted, after the signature it documents when it has one ("uuid4()"), with
 * the button that opens its passage (highlighted there). */
function evidenceItem(ev, sources, evidence) {
  const hit = sources.find((s) => s.chunk_id === ev.chunk_id) || { chunk_id: ev.chunk_id, label: ev.label };
  return el("li", {}, ev.signature ? el("code", { class: "signature" }, ev.signature) : null, ev.signature ? ": " : null,
    el("q", {}, ev.text), " ", citeButton(hit, `[${ev.label}]`, evidence));
}

// -- status -----------------------------------------------------------------------------------
let modeChosen = false;

async function loadStatus() {
  try {
    const s = await (await api("/v1/status")).json();
    $("status-documents").textContent = s.documents.toLocaleString();
    $("status-chunks").textContent = s.chunks.toLocaleString();
    $("status-bytes").textContent = formatBytes(s.bytes);
    const when = new Date(s.updated * 1000);
    $("status-updated").dateTime = when.toISOString();
    $("status-updated").textContent = when.toLocaleString();
    $("status").title = `${s.path} · ${s.storage} storage · ${s.embedder}`;
    if (!modeChosen) $("search-mode").value = s.search_mode;
  } catch (e) {
    $("status-documents").textContent = "?";
    $("status").title = e.message;
  }
}

// -- asking -----------------------------------------------------------------------------------
function newTurn(question) {
  const answer = el("div", { class: "answer", "aria-live": "polite", "aria-busy": "true" });
  const turn = {
    answer,
    usage: el("p", { class: "usage" }),
    evidence: el("ol", { class: "evidence" }),
    sources: el("ol", { class: "sources" }),
    error: el("p", { class: "error", role: "alert", hidden: true }),
  };
  turn.evidenceBox = el("details", { class: "evidence-box", open: true, hidden: true },
    el("summary", {}, "Evidence: the passage sentences that answer the question"), turn.evidence);
  const item = el("li", { class: "turn" },
    el("p", { class: "question" }, el("span", { class: "who" }, "You"), question),
    el("div", { class: "reply" }, el("span", { class: "who" }, "Answer"), answer),
    turn.error, turn.usage, turn.evidenceBox,
    el("details", { class: "sources-box", open: true }, el("summary", {}, "Sources"), turn.sources));
  $("conversation").append(item);
  item.scrollIntoView({ block: "nearest" });
  return turn;
}

/** The answer as Markdown, its "[label]" citations turned into buttons that open the passage. */
function renderAnswer(node, text, sources, evidence = []) {
  const byLabel = new Map(sources.map((s) => [s.label, s]));
  node.replaceChildren(renderMarkdown(text, (label) => {
    const hit = byLabel.get(label);
    return hit ? citeButton(hit, `[${label}]`, evidence) : null;
  }));
}

function usageLine(usage, ext, pageTtft) {
  const parts = [];
  if (usage) {
    const cached = (usage.prompt_tokens_details || {}).cached_tokens || 0;
    parts.push(`${usage.prompt_tokens} prompt tokens (${cached} cached)`, `${usage.completion_tokens} generated`);
  }
  if (ext) parts.push(`${ext.mode} answer`, `first token ${seconds(ext.ttft_s)}`, `total ${seconds(ext.total_s)}`);
  if (pageTtft !== null) parts.push(`first text on this page after ${seconds(pageTtft)}`);
  return parts.join(" · ");
}

/** What the reader is told when an answer ended early (`finish_reason`). */
const NOTICES = {
  length: "cut off at the token limit",
  loop: "stopped: the answer started repeating itself",
};

async function ask(question) {
  const turn = newTurn(question);
  const messages = [...conversation, { role: "user", content: question }];
  const startedIn = conversationId;
  const started = performance.now();
  let text = "", firstAt = null, usage = null, ext = null, finish = null;
  try {
    const mode = $("answer-mode").value;  // "": the server's default (slimrag serve --answer)
    const res = await postJSON("/v1/chat/completions", {
      model: "slimrag", messages, stream: true, stream_options: { include_usage: true },
      ...(mode ? { answer: mode } : {}) });
    for await (const event of sseEvents(res)) {
      if (event === "[DONE]") break;
      if (event.error) throw new ApiError(event.error.message);
      const choice = (event.choices || [])[0];
      const piece = choice && choice.delta && choice.delta.content;
      if (piece) {
        if (firstAt === null) firstAt = performance.now();
        text += piece;
        renderAnswer(turn.answer, text, []);
      }
      if (choice && choice.finish_reason) finish = choice.finish_reason;
      if (event.usage) usage = event.usage;
      if (event.slimrag) ext = event.slimrag;
    }
  } catch (e) {
    turn.error.textContent = `The answer failed: ${e.message}`;
    turn.error.hidden = false;
    turn.answer.setAttribute("aria-busy", "false");
    return;
  }
  const sources = ext ? ext.sources : [];
  const evidence = (ext && ext.evidence) || [];
  for (const ev of evidence) turn.evidence.append(evidenceItem(ev, sources, evidence));
  turn.evidenceBox.hidden = evidence.length === 0;
  renderAnswer(turn.answer, text, sources, evidence);
  const notice = NOTICES[finish];
  if (notice) turn.answer.append(el("span", { class: "notice" }, ` [${notice}]`));
  if (ext && ext.verdict === "not_backed") {  // the check's verdict follows the text (issue 29)
    const shown = el("div", { class: "verdict not-backed", role: "note" });
    renderAnswer(shown, ext.shown, sources, evidence);
    turn.answer.after(shown);
  }
  turn.answer.setAttribute("aria-busy", "false");
  turn.usage.textContent = usageLine(usage, ext, firstAt === null ? null : (firstAt - started) / 1000);
  const used = ext && ext.support && ext.support.length ? new Set(ext.used) : null;
  if (sources.length) sources.forEach((s) => turn.sources.append(sourceItem(s, used ? used.has(s.label) : undefined, evidence)));
  else turn.sources.append(el("li", {}, "No passage was relevant enough to cite."));
  if (startedIn === conversationId) conversation.push({ role: "user", content: question }, { role: "assistant", content: text });
}

// -- passages ---------------------------------------------------------------------------------
/** Sources whose text keeps the markup's indentation (HTML pages indexed before slimrag
 * extracted their main content): each line is shown without its leading blanks. */
const MARKUP = /\.(x?html?|xml|epub)(\.gz)?$/i;

/** A passage as the reader should see it: its lines after the first without the indentation
 * they share (all of a markup source's indentation), and runs of blank lines folded. Code keeps
 * its relative indentation. The first line is left alone: a neighbour's text may start mid-line.
 * Display only: the cited text itself is unchanged. */
function tidy(text, source = "") {
  const [first, ...rest] = text.split("\n");
  let lines = rest;
  if (MARKUP.test(source)) lines = lines.map((l) => l.trimStart());
  const leads = lines.filter((l) => l.trim()).map((l) => l.length - l.trimStart().length);
  const common = leads.length ? Math.min(...leads) : 0;
  return [first, ...lines.map((l) => l.slice(common))].join("\n").replace(/\n[ \t]*\n(?:[ \t]*\n)+/g, "\n\n");
}

/** Characters at the end of `a` that start `b`: neighbouring chunks of a long section overlap
 * (the chunker repeats a few tokens so a sentence cut at a boundary is found from either side). */
function overlap(a, b) {
  const probe = b.slice(0, 16);
  for (let at = Math.max(0, a.length - b.length); probe && (at = a.indexOf(probe, at)) !== -1; at += 1) {
    if (b.startsWith(a.slice(at))) return a.length - at;
  }
  return 0;
}

/** Where `sentence` is in `text`: [start, end], or null. Exact first; else with any run of white
 * space matching any other (the view folds a markup source's indentation). */
function findSentence(text, sentence) {
  const at = text.indexOf(sentence);
  if (at !== -1) return [at, at + sentence.length];
  const words = sentence.trim().split(/\s+/).map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  const m = new RegExp(words.join("\\s+")).exec(text);
  return m ? [m.index, m.index + m[0].length] : null;
}

/** `text` as nodes, each evidence sentence of `chunkId` in it wrapped in <mark class="evidence">. */
function withEvidence(text, chunkId) {
  const spans = highlighted.filter((ev) => ev.chunk_id === chunkId).map((ev) => findSentence(text, ev.text))
    .filter(Boolean)
    .sort((a, b) => a[0] - b[0]);
  const nodes = [];
  let at = 0;
  for (const [start, end] of spans) {
    if (start < at) continue; // overlapping sentences: the first one wins
    if (start > at) nodes.push(text.slice(at, start));
    nodes.push(el("mark", { class: "evidence", title: "evidence for the answer" }, text.slice(start, end)));
    at = end;
  }
  if (at < text.length) nodes.push(text.slice(at));
  return nodes;
}

/** One chunk of the passage view; neighbours show their text without what the cited chunk repeats.
 * The cited chunk's evidence sentences are highlighted. */
function chunkBlock(chunk, where, text = chunk.text) {
  const current = where === "cited";
  const body = el(current ? "mark" : "div", { class: "chunk-text" }, ...(current ? withEvidence(text, chunk.chunk_id) : [text]));
  if (current) body.id = "passage-text";
  else {
    body.tabIndex = 0; // a scrollable region must be reachable by keyboard
    body.setAttribute("aria-label", `text ${where} the cited passage`);
  }
  const page = chunk.page ? ` · page ${chunk.page}` : "";
  return el("div", { class: `chunk ${where}`, dataset: { chunkId: String(chunk.chunk_id) },
    "aria-current": current ? "true" : "false" },
  el("p", { class: "chunk-caption" }, `${current ? "cited passage" : where} · chunk ${chunk.ordinal}${page}`),
  body);
}

async function showPassage(chunkId, evidence = []) {
  highlighted = evidence;
  const section = $("passage");
  let p;
  try {
    p = await (await api(`/v1/passages/${encodeURIComponent(chunkId)}?around=1`)).json();
  } catch (e) {
    $("passage-source").textContent = "";
    $("passage-page").textContent = "";
    $("passage-label").textContent = "";
    $("passage-body").replaceChildren(el("p", { class: "error", role: "alert" }, e.message));
    section.hidden = false;
    return;
  }
  $("passage-source").textContent = p.source;
  $("passage-page").textContent = p.page ? `page ${p.page}` : "";
  $("passage-label").textContent = p.label;
  const order = [...p.before, p, ...p.after];
  const shown = order.map((c, i) => {
    let text = c.text;
    if (i < p.before.length) text = text.slice(0, text.length - overlap(text, order[i + 1].text));
    if (i > p.before.length) text = text.slice(overlap(order[i - 1].text, text));
    return text;
  });
  $("passage-body").replaceChildren(...order.map((c, i) => chunkBlock(
    c, i < p.before.length ? "before" : i === p.before.length ? "cited" : "after", tidy(shown[i], p.source))));
  section.hidden = false;
  // the text nearest the cited passage in view: the end of what comes before it
  for (const before of section.querySelectorAll(".chunk.before .chunk-text")) before.scrollTop = before.scrollHeight;
  section.focus({ preventScroll: true });
  section.scrollIntoView({ block: "nearest" });
}

// -- search -----------------------------------------------------------------------------------
/** A hit's text in at most 240 characters, blank runs folded (a snippet, not the passage). */
function snippet(text) {
  const flat = text.replace(/[ \t]+/g, " ").replace(/\n\s*\n+/g, "\n");
  return flat.length > 240 ? `${flat.slice(0, 240)}…` : flat;
}

async function search(query, mode) {
  showError("search-error", "");
  $("search-summary").textContent = "Searching…";
  try {
    const hits = (await (await postJSON("/v1/search", { query, mode, k: 8 })).json()).data;
    $("search-results").replaceChildren(...hits.map((h) => {
      const item = sourceItem(h);
      item.append(el("span", { class: "score" }, ` · score ${h.score.toFixed(3)}`),
        el("p", { class: "snippet" }, snippet(tidy(h.text, h.source))));
      return item;
    }));
    $("search-summary").textContent = `${hits.length} result${hits.length === 1 ? "" : "s"} (${mode})`;
  } catch (e) {
    $("search-summary").textContent = "";
    showError("search-error", e.message);
  }
}

// -- wiring -----------------------------------------------------------------------------------
function init() {
  $("ask-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const question = $("question").value.trim();
    if (!question) return;
    showError("ask-error", "");
    $("question").value = "";
    $("ask-button").disabled = true;
    try {
      await ask(question);
    } finally {
      $("ask-button").disabled = false;
      $("question").focus();
    }
  });
  $("question").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("ask-form").requestSubmit();
    }
  });
  $("new-conversation").addEventListener("click", () => {
    conversation.length = 0;
    conversationId += 1;
    $("conversation").replaceChildren();
    $("question").focus();
  });
  $("search-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    search($("search-query").value.trim(), $("search-mode").value);
  });
  $("search-mode").addEventListener("change", () => { modeChosen = true; });
  $("passage-close").addEventListener("click", () => { $("passage").hidden = true; });
  $("status-refresh").addEventListener("click", loadStatus);
  loadStatus();
}

init();
