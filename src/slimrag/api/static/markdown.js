// A small Markdown renderer for the answers of the web page, written for slimrag: it builds DOM
// nodes and sets every piece of text with textContent (text nodes), so nothing a model writes is
// ever parsed as HTML. Raw HTML in an answer (`<script>`, `<img onerror=...>`) shows as the text it
// is. No third-party code, no build step.
//
// What it understands (what small models write): paragraphs (a single newline is a line break),
// ATX headings (shown two levels down, under the page's own h1/h2), fenced code blocks (``` or ~~~;
// an unclosed fence runs to the end, so a streaming answer renders while it grows), indented
// code is NOT a block (models indent prose in lists), bullet and numbered lists (nested by
// indentation), block quotes, thematic breaks, and inline `code`, **strong**, *emphasis*,
// ~~strike~~, [text](url) and <url> links, backslash escapes. A link is a link only when its URL is
// absolute http(s); it opens in a new tab with no referrer and no opener. Any other URL
// (javascript:, data:, relative) is dropped: its text shows as plain text. A `[label]` that is not
// a link goes to the caller's `citation(label)`, which returns a node (a citation button) or null
// (the brackets show as text).
"use strict";

const MD_FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
const MD_HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const MD_RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const MD_QUOTE = /^ {0,3}> ?/;
const MD_ITEM = /^( {0,12})([-*+]|\d{1,9}[.)])([ \t]+|$)/;

/** The answer `text` as a DocumentFragment; `citation(label)` turns "[label]" into a node. */
function renderMarkdown(text, citation = () => null) {
  const out = document.createDocumentFragment();
  blocks(String(text).replace(/\r\n?/g, "\n").split("\n"), out, citation);
  return out;
}

function mdNode(tag, ...children) {
  const node = document.createElement(tag);
  node.append(...children);
  return node;
}

/** True when `line` starts a block other than a paragraph (it ends a paragraph). */
function startsBlock(line) {
  return MD_FENCE.test(line) || MD_HEADING.test(line) || MD_RULE.test(line) || MD_QUOTE.test(line)
    || MD_ITEM.test(line);
}

function blocks(lines, parent, citation) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) {
      i += 1;
    } else if ((m = MD_FENCE.exec(line))) {
      const close = new RegExp(`^ {0,3}${m[1][0]}{${m[1].length},}\\s*$`);
      const body = [];
      for (i += 1; i < lines.length && !close.test(lines[i]); i += 1) body.push(lines[i]);
      i += 1; // the closing fence (or past the end)
      const code = mdNode("code", body.join("\n"));
      if (/^[\w+#.-]{1,30}$/.test(m[2])) code.dataset.lang = m[2];
      parent.append(mdNode("pre", code));
    } else if ((m = MD_HEADING.exec(line))) {
      const h = document.createElement(`h${Math.min(6, m[1].length + 2)}`);
      inline(m[2] || "", h, citation);
      parent.append(h);
      i += 1;
    } else if (MD_RULE.test(line)) {
      parent.append(document.createElement("hr"));
      i += 1;
    } else if (MD_QUOTE.test(line)) {
      const body = [];
      for (; i < lines.length && MD_QUOTE.test(lines[i]); i += 1) body.push(lines[i].replace(MD_QUOTE, ""));
      const quote = document.createElement("blockquote");
      blocks(body, quote, citation);
      parent.append(quote);
    } else if (MD_ITEM.test(line)) {
      i = list(lines, i, parent, citation);
    } else {
      const body = [line.trim()];
      for (i += 1; i < lines.length && lines[i].trim() && !startsBlock(lines[i]); i += 1) body.push(lines[i].trim());
      const p = document.createElement("p");
      inline(body.join("\n"), p, citation);
      parent.append(p);
    }
  }
}

/** A list from `lines[start]` on; its items are the lines up to the next item at its indentation,
 * rendered as blocks of their own (so nested lists and code work). Returns the next line's index. */
function list(lines, start, parent, citation) {
  const first = MD_ITEM.exec(lines[start]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const node = document.createElement(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
  const items = [];
  let loose = false;
  let i = start;
  while (i < lines.length) {
    const m = MD_ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const inner = m[1].length + m[2].length + Math.max(1, Math.min(m[3].length, 4));
    const body = [lines[i].slice(m[0].length)];
    for (i += 1; i < lines.length; i += 1) {
      const line = lines[i];
      const lead = line.length - line.trimStart().length;
      if (!line.trim()) {
        const next = lines.slice(i + 1).find((l) => l.trim());
        const nextLead = next === undefined ? 0 : next.length - next.trimStart().length;
        if (next === undefined || nextLead <= indent) {
          const sibling = next !== undefined && MD_ITEM.exec(next);
          if (sibling && sibling[1].length === indent) loose = true;
          break;
        }
        loose = true;
        body.push("");
      } else if (lead > indent && (lead >= inner || MD_ITEM.test(line))) {
        body.push(line.slice(Math.min(lead, inner)));
      } else if (lead > indent || !startsBlock(line)) {
        body.push(line.trim()); // a lazy continuation of the item's paragraph
      } else {
        break;
      }
    }
    while (i < lines.length && !lines[i].trim()) {
      const next = lines.slice(i).find((l) => l.trim());
      const m2 = next && MD_ITEM.exec(next);
      if (!m2 || m2[1].length !== indent) break;
      i += 1;
    }
    items.push(body);
  }
  for (const body of items) {
    const li = document.createElement("li");
    const tight = !loose && !body.some((l, k) => k > 0 && startsBlock(l) && !MD_ITEM.test(l));
    if (tight && !body.slice(1).some((l) => MD_ITEM.test(l))) {
      inline(body.join("\n").trim(), li, citation);
    } else {
      blocks(body, li, citation);
      if (!loose && li.firstChild && li.firstChild.tagName === "P") li.firstChild.replaceWith(...li.firstChild.childNodes);
    }
    node.append(li);
  }
  parent.append(node);
  return i;
}

/** An absolute http(s) URL, or null: the only links the renderer makes. */
function safeUrl(raw) {
  try {
    const url = new URL(raw);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch (_) {
    return null; // relative or malformed: shown as text
  }
}

function mdLink(href, parent, label, citation) {
  const a = document.createElement("a");
  a.href = href;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  if (typeof label === "string") inline(label, a, citation);
  else a.textContent = href;
  parent.append(a);
}

const MD_INLINE = [
  // [text](url "title")
  [/\[((?:[^\[\]\\\n]|\\.)*)\]\(\s*<?((?:[^\s<>()]|\([^\s<>()]*\))*)>?(?:\s+(?:"[^"\n]*"|'[^'\n]*'))?\s*\)/y, (m, parent, citation) => {
    const href = safeUrl(m[2]);
    if (href) mdLink(href, parent, m[1], citation);
    else inline(m[1], parent, citation);
  }],
  // <https://...>
  [/<(https?:\/\/[^\s<>]+)>/y, (m, parent) => {
    const href = safeUrl(m[1]);
    if (href) mdLink(href, parent, null);
    else parent.append(document.createTextNode(m[0]));
  }],
  // [label]: a citation, when the caller knows the label
  [/\[([^\[\]\n]+)\]/y, (m, parent, citation) => {
    const node = citation(m[1]);
    if (node) parent.append(node);
    else { const text = document.createTextNode("["); parent.append(text); inline(`${m[1]}]`, parent, citation); }
  }],
  [/\*\*(?=\S)([\s\S]*?\S)\*\*/y, (m, parent, citation) => parent.append(inlineIn("strong", m[1], citation))],
  [/__(?=\S)([\s\S]*?\S)__(?!\w)/y, (m, parent, citation) => parent.append(inlineIn("strong", m[1], citation))],
  [/\*(?=[^\s*])((?:[^*]|\*\*[^*]+\*\*)*?[^\s*])\*(?!\*)/y, (m, parent, citation) => parent.append(inlineIn("em", m[1], citation))],
  [/_(?=[^\s_])([^_]*?[^\s_])_(?!\w)/y, (m, parent, citation) => parent.append(inlineIn("em", m[1], citation))],
  [/~~(?=\S)([\s\S]*?\S)~~/y, (m, parent, citation) => parent.append(inlineIn("del", m[1], citation))],
];

function inlineIn(tag, text, citation) {
  const node = document.createElement(tag);
  inline(text, node, citation);
  return node;
}

/** Text with line breaks: a text node per line, <br> between. */
function mdText(text, parent) {
  text.split("\n").forEach((piece, k) => {
    if (k) parent.append(document.createElement("br"));
    if (piece) parent.append(document.createTextNode(piece));
  });
}

/** Inline markup of `text`, appended to `parent`; everything not markup is a text node. */
function inline(text, parent, citation) {
  let plain = "";
  const flush = () => { if (plain) mdText(plain, parent); plain = ""; };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === "\\" && i + 1 < text.length && /[!-/:-@[-`{-~]/.test(text[i + 1])) {
      plain += text[i + 1];
      i += 2;
      continue;
    }
    if (c === "`") {
      const run = /`+/y;
      run.lastIndex = i;
      const ticks = run.exec(text)[0];
      const close = new RegExp(`(?<!\`)${ticks}(?!\`)`, "g");
      close.lastIndex = i + ticks.length;
      const end = close.exec(text);
      if (end) {
        flush();
        let code = text.slice(i + ticks.length, end.index).replace(/\n/g, " ");
        if (/^ .*[^ ].* $/.test(code)) code = code.slice(1, -1);
        parent.append(mdNode("code", code));
        i = end.index + ticks.length;
      } else {
        plain += ticks;
        i += ticks.length;
      }
      continue;
    }
    if ("[<*_~".includes(c) && !(c === "_" && /\w/.test(text[i - 1] || ""))) {
      let matched = false;
      for (const [pattern, emit] of MD_INLINE) {
        pattern.lastIndex = i;
        const m = pattern.exec(text);
        if (m) {
          flush();
          emit(m, parent, citation);
          i = pattern.lastIndex;
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    plain += c;
    i += 1;
  }
  flush();
}
