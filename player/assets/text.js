// The player's words and el(), the one way the player puts text on the page: as textContent,
// never as HTML. Shared by player.js, panels.js and charts.js.
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
