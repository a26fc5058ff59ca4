// The player's words, el() and md(), the only ways the player puts text on the page: as
// textContent, never as HTML (md() builds a lesson's Markdown from such nodes). Shared by
// player.js, panels.js and charts.js.
//
// The words are not written here: they are the `player.<name>` entries of the app's one
// catalogue (words/strings.json), sent with a run's head (player/payload.py: player_book) or
// inlined by the static export, and read as L.<name>. A text with fields is a template,
// "Step {step} of {total}", filled by fmt().

const STRINGS = {};   // lang -> {name: text}

export function addStrings(byLang) { Object.assign(STRINGS, byLang || {}); }

export function wordsFor(lang) { return STRINGS[lang] || STRINGS.en || {}; }

export function fmt(template, fields) {
  return String(template === undefined ? "" : template).replace(/\{\{|\}\}|\{(\w+)\}/g, (m, name) =>
    name === undefined ? m[0] : (name in fields ? String(fields[name]) : m));
}

// A text drawn in one row (a generated text, a block's tokens): each line break is shown as a
// visible mark, so the rest of the text stays in its row instead of starting a loose line.
export function oneLine(text) { return String(text).replace(/\r\n|\r|\n/g, "\u21b5"); }

export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

// -- a lesson's own Markdown, drawn as DOM nodes -------------------------------------------------
// Narration and captions are written in a small Markdown: **bold**, *italic*, `code`,
// [words](a web address) and backslash escapes. md() turns such a text into nodes built with
// createElement / textContent, so nothing in it is ever parsed as HTML. A value the server filled
// into a lesson's text (a request id, a block list) arrives backslash-escaped (ui/panels.py), so it
// shows as written and never as formatting. Anything that does not pair up stays literal text.

const ASCII_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
const SAFE_LINK = /^https?:\/\/[^\s<>"'`]+$/;

// The text as a flat list: strings, {code}, {link, words}, and runs of stars {stars, open, close}.
function mdTokens(s) {
  const out = [];
  let buf = "";
  const flush = () => { if (buf) { out.push(buf); buf = ""; } };
  let i = 0;
  while (i < s.length) {
    const c = s[i];
    if (c === "\\" && i + 1 < s.length && ASCII_PUNCT.includes(s[i + 1])) {
      buf += s[i + 1]; i += 2; continue;
    }
    if (c === "`") {
      let n = 1;
      while (s[i + n] === "`") n++;
      const fence = "`".repeat(n);
      let j = s.indexOf(fence, i + n);
      while (j >= 0 && s[j + n] === "`") {          // a longer run does not close this one
        let k = j; while (s[k] === "`") k++;
        j = s.indexOf(fence, k);
      }
      if (j < 0) { buf += fence; i += n; continue; }
      let code = s.slice(i + n, j);
      if (code.length > 2 && code[0] === " " && code[code.length - 1] === " " && code.trim()) code = code.slice(1, -1);
      flush(); out.push({ code }); i = j + n; continue;
    }
    if (c === "*") {
      let n = 1;
      while (s[i + n] === "*") n++;
      const before = i > 0 ? s[i - 1] : " ", after = i + n < s.length ? s[i + n] : " ";
      flush();
      out.push({ stars: n, open: !/\s/.test(after), close: !/\s/.test(before) });
      i += n; continue;
    }
    if (c === "[") {
      const m = /^\[([^\[\]\n]+)\]\(([^()\s]+)\)/.exec(s.slice(i));
      if (m && SAFE_LINK.test(m[2])) { flush(); out.push({ link: m[2], words: m[1] }); i += m[0].length; continue; }
    }
    buf += c; i++;
  }
  flush();
  return out;
}

// Pair star runs of the same length (the nearest opener first): 2 -> strong, 1 -> em.
function mdTree(tokens) {
  const items = tokens.slice();
  const openers = [];
  for (let i = 0; i < items.length; i++) {
    const t = items[i];
    if (!t || t.stars === undefined) continue;
    let at = -1;
    if (t.close && (t.stars === 1 || t.stars === 2)) {
      for (let k = openers.length - 1; k >= 0; k--) if (openers[k].stars === t.stars) { at = k; break; }
    }
    if (at >= 0) {
      const o = openers[at];
      const from = items.indexOf(o);
      if (i - from > 1) {
        const node = { tag: t.stars === 2 ? "strong" : "em", kids: items.slice(from + 1, i) };
        items.splice(from, i - from + 1, node);
        openers.length = at;
        i = from;
        continue;
      }
    }
    if (t.open && (t.stars === 1 || t.stars === 2)) openers.push(t);
  }
  return items;
}

function mdNodes(items) {
  return items.map((t) => {
    if (typeof t === "string") return document.createTextNode(t);
    if (t.stars !== undefined) return document.createTextNode("*".repeat(t.stars));
    if (t.code !== undefined) return el("code", null, t.code);
    if (t.link !== undefined) {
      const a = el("a", null, t.words);
      a.href = t.link; a.target = "_blank"; a.rel = "noopener noreferrer";
      return a;
    }
    const e = el(t.tag);
    e.append(...mdNodes(t.kids));
    return e;
  });
}

// The nodes of one Markdown text (a lesson's narration, a caption), to append to an element.
export function md(text) {
  return mdNodes(mdTree(mdTokens(String(text === undefined || text === null ? "" : text))));
}

// An element holding a Markdown text: el() for a lesson's own words.
export function mdEl(tag, cls, text) {
  const e = el(tag, cls);
  e.append(...md(text));
  return e;
}
