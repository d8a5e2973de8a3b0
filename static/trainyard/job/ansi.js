// A trainer's line as a terminal would show it: colours and styles from SGR escapes kept as
// CSS classes, every other escape and control character dropped. Pure: text in, segments out;
// the log view turns segments into text nodes, so whatever a trainer prints stays text.
// CSI (ESC [ ... final byte), OSC (ESC ] ... BEL or ST), DCS/SOS/PM/APC strings, other ESC
// sequences, 8-bit CSI, and every other control character but tab and newline.
const ESCAPES =
  /\x1b\[([0-?]*)[ -/]*([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[PX^_][^\x1b]*(?:\x1b\\)?|\x1b[ -/]*[0-~]?|\x9b[0-?]*[ -/]*[@-~]|[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f-\x9f]/g;
const COLOURS = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"];
const colourName = (n) => (n < 8 ? COLOURS[n] : `bright-${COLOURS[n - 8]}`);

function applySgr(style, params) {
  const codes = params === "" ? [0] : params.split(";").map((p) => parseInt(p.split(":")[0], 10) || 0);
  for (let i = 0; i < codes.length; i++) {
    const c = codes[i];
    if (c === 0) Object.assign(style, { fg: null, bg: null, bold: false, dim: false, italic: false, underline: false });
    else if (c === 1) style.bold = true;
    else if (c === 2) style.dim = true;
    else if (c === 3) style.italic = true;
    else if (c === 4) style.underline = true;
    else if (c === 22) style.bold = style.dim = false;
    else if (c === 23) style.italic = false;
    else if (c === 24) style.underline = false;
    else if (c >= 30 && c <= 37) style.fg = c - 30;
    else if (c === 39) style.fg = null;
    else if (c >= 40 && c <= 47) style.bg = c - 40;
    else if (c === 49) style.bg = null;
    else if (c >= 90 && c <= 97) style.fg = c - 90 + 8;
    else if (c >= 100 && c <= 107) style.bg = c - 100 + 8;
    else if (c === 38 || c === 48) {
      // 256 colours: the first 16 are the named ones; other palettes and RGB are skipped.
      let value = null;
      if (codes[i + 1] === 5) { value = codes[i + 2] < 16 ? codes[i + 2] : null; i += 2; }
      else if (codes[i + 1] === 2) i += 4;
      if (c === 38) style.fg = value; else style.bg = value;
    }
  }
}

function styleClass(s) {
  const cls = [];
  if (s.fg !== null) cls.push(`ansi-${colourName(s.fg)}`);
  if (s.bg !== null) cls.push(`ansi-bg-${colourName(s.bg)}`);
  if (s.bold) cls.push("ansi-bold");
  if (s.dim) cls.push("ansi-dim");
  if (s.italic) cls.push("ansi-italic");
  if (s.underline) cls.push("ansi-underline");
  return cls.join(" ");
}


// What a terminal shows: the text after the last carriage return (a trailing empty part, as
// in "50%\r", does not count), in the colours set so far; every other escape is dropped.
const PLAIN = /^[^\x00-\x08\x0b-\x1f\x7f-\x9f]*$/; // nothing to interpret: the common case

export function parseText(text) {
  if (PLAIN.test(text)) return text ? [{ text, cls: "" }] : [];
  const parts = text.split("\r");
  let shown = parts.length - 1;
  while (shown > 0 && parts[shown].replace(ESCAPES, "") === "") shown--;
  const style = { fg: null, bg: null, bold: false, dim: false, italic: false, underline: false };
  const segments = [];
  for (let p = 0; p <= shown; p++) {
    const part = parts[p];
    let at = 0;
    const emit = (s) => {
      if (p !== shown || s === "") return;
      const cls = styleClass(style);
      const last = segments[segments.length - 1];
      if (last && last.cls === cls) last.text += s;
      else segments.push({ text: s, cls });
    };
    for (const m of part.matchAll(ESCAPES)) {
      emit(part.slice(at, m.index));
      at = m.index + m[0].length;
      if (m[2] === "m" && /^[\d;:]*$/.test(m[1])) applySgr(style, m[1]);
    }
    emit(part.slice(at));
  }
  return segments;
}
