// A line's text as the viewer shows it, and where a search's matches are in it. Pure.
//
// The server decides what a line shows (jobs/logshape.py: the carriage-return rule, colours,
// escapes dropped) and sends it as `shown`, [text, CSS classes] runs, with every line whose
// text does not show as it is; a line without `shown` shows its text. Matches compare text as
// Python's str.casefold does: lowercase, but for the characters in `foldTable` (the server's
// rules, `casefold_exceptions`). Offsets count code points, as the server's `hits` do.

export function segmentsOf(line) {
  if (line.shown) return line.shown;
  return line.text ? [[line.text, ""]] : [];
}

export function plainOf(segments) {
  let s = "";
  for (const [text] of segments) s += text;
  return s;
}

export function casefold(text, foldTable) {
  let out = "";
  for (const ch of text) out += foldTable[ch] ?? ch.toLowerCase();
  return out;
}

// [start, end) code-point ranges of `needle` in `shown`, without overlaps. A character that
// folds to several ("ß" to "ss") is inside a match if any part of its folding is.
export function findRanges(needle, shown, foldTable) {
  const want = casefold(needle, foldTable);
  if (!want) return [];
  let folded = "";
  const origin = []; // origin[u]: the code point of `shown` that UTF-16 unit u of `folded` came from
  let i = 0;
  for (const ch of shown) {
    const f = foldTable[ch] ?? ch.toLowerCase();
    folded += f;
    for (let u = 0; u < f.length; u++) origin.push(i);
    i++;
  }
  const ranges = [];
  for (let at = folded.indexOf(want); at >= 0; at = folded.indexOf(want, at + want.length)) {
    ranges.push([origin[at], origin[at + want.length - 1] + 1]);
  }
  return ranges;
}

// The runs to render: each segment cut where a match starts or ends, `marked` inside one.
export function pieces(segments, ranges) {
  if (!ranges.length) return segments.map(([text, cls]) => ({ text, cls, marked: false }));
  const out = [];
  let offset = 0; // code points before this segment
  let r = 0;
  for (const [text, cls] of segments) {
    const chars = Array.from(text);
    const end = offset + chars.length;
    let at = offset;
    while (at < end) {
      while (r < ranges.length && ranges[r][1] <= at) r++;
      let stop = end;
      let marked = false;
      if (r < ranges.length && ranges[r][0] <= at) {
        marked = true;
        stop = Math.min(end, ranges[r][1]);
      } else if (r < ranges.length && ranges[r][0] < end) stop = ranges[r][0];
      out.push({ text: chars.slice(at - offset, stop - offset).join(""), cls, marked });
      at = stop;
    }
    offset = end;
  }
  return out;
}
