// URL and URLSearchParams for sandboxed tools: the URL Standard's basic URL parser (with the state
// overrides its setters use), host parsing (domains, IPv4, IPv6, opaque hosts), serialization, and
// application/x-www-form-urlencoded parsing and serialization, in plain JavaScript. It follows the
// standard as browsers ship it in 2024: "^" stays unencoded in paths, and clearing the query or
// fragment of a URL with an opaque path strips that path's trailing spaces.
//
// The factory takes every built-in it uses once, when it runs (from a record the runtime made
// before tool code ran, if it runs later); from then on its code looks up no global name and no
// method of a built-in prototype, never iterates internal arrays (they have no prototype, are
// filled by index and read by index), and keeps its state in private fields. Tool code may replace
// String.prototype methods, Array.prototype.push, RegExp.prototype.exec, Symbol.iterator methods,
// setters on Array.prototype indices and the like: URL objects behave the same. The classes are
// not frozen (browsers do not freeze them); changing their prototypes only changes what tool code
// itself calls.
//
// Scanning is linear in the input: components are cut out of the input with slices and percent-
// encoded in runs, never built one code unit at a time by string concatenation.
#include "runtime/url_prelude.h"

namespace toolhost::runtime {

const char* const kUrlPrelude = R"JS((function (intrinsics) {
  'use strict';

  // ---- Built-ins, taken before any tool code can replace them. ----
  // Called with no argument, the factory runs before any tool code and reads the built-ins it
  // uses from the global object. A runtime that runs it later (on first use) passes instead an
  // object without a prototype that maps paths ("String.prototype.slice") to built-ins it took
  // before tool code ran; then nothing is read from the global object but what that object
  // lacks. Without "RegExp" and "RegExp.prototype.exec" there, scanning falls back to plain
  // loops (slower in the interpreter); without "String.prototype.lastIndexOf", likewise.
  const record = intrinsics === undefined || intrinsics === null ? null : intrinsics;
  const take = (path, read) => (record !== null && path in record ? record[path] : read());
  const optional = (path, read) => (record === null ? read() : take(path, () => null));
  const ReflectApply = take('Reflect.apply', () => Reflect.apply);
  const FunctionBind = take('Function.prototype.bind', () => Function.prototype.bind);
  const FunctionCall = take('Function.prototype.call', () => Function.prototype.call);
  const uncurry = (method) => ReflectApply(FunctionBind, FunctionCall, [method]);
  const ReflectOwnKeys = take('Reflect.ownKeys', () => Reflect.ownKeys);
  const ReflectGetOwnPropertyDescriptor =
      take('Reflect.getOwnPropertyDescriptor', () => Reflect.getOwnPropertyDescriptor);
  const ObjectDefineProperty = take('Object.defineProperty', () => Object.defineProperty);
  const ObjectGetPrototypeOf = take('Object.getPrototypeOf', () => Object.getPrototypeOf);
  const ObjectSetPrototypeOf = take('Object.setPrototypeOf', () => Object.setPrototypeOf);
  const TypeErrorCtor = take('TypeError', () => TypeError);
  const Uint8ArrayCtor = take('Uint8Array', () => Uint8Array);
  const MathFloor = take('Math.floor', () => Math.floor);
  const SymbolIterator = take('Symbol.iterator', () => Symbol.iterator);
  const SymbolToStringTag = take('Symbol.toStringTag', () => Symbol.toStringTag);
  const fromCharCode = take('String.fromCharCode', () => String.fromCharCode);
  const charCodeAt = uncurry(take('String.prototype.charCodeAt',
                                  () => String.prototype.charCodeAt));
  const stringSlice = uncurry(take('String.prototype.slice', () => String.prototype.slice));
  const toLowerCase = uncurry(take('String.prototype.toLowerCase',
                                   () => String.prototype.toLowerCase));
  const indexOf = uncurry(take('String.prototype.indexOf', () => String.prototype.indexOf));
  const arrayJoin = uncurry(take('Array.prototype.join', () => Array.prototype.join));
  // Absent, or the identity in a V8 built without ICU; then domains are not normalized.
  const normalizeMethod = take('String.prototype.normalize', () => String.prototype.normalize);
  const normalize = typeof normalizeMethod === 'function' ? uncurry(normalizeMethod) : null;
  const lastIndexOfMethod = optional('String.prototype.lastIndexOf',
                                     () => String.prototype.lastIndexOf);
  const lastIndexOf = lastIndexOfMethod === null ? null : uncurry(lastIndexOfMethod);
  const RegExpCtor = optional('RegExp', () => RegExp);
  const regExpExecMethod = optional('RegExp.prototype.exec', () => RegExp.prototype.exec);
  const regExpExec = regExpExecMethod === null ? null : uncurry(regExpExecMethod);
  const useRegExp = RegExpCtor !== null && regExpExec !== null;
  // %IteratorPrototype%: as the runtime captured it, or reached through a generator's prototype
  // (no tool code runs for that, but a tool may have changed that prototype's prototype).
  const IteratorPrototype = take('%IteratorPrototype%', () =>
      ObjectGetPrototypeOf(ObjectGetPrototypeOf(function* () {}.prototype)));
  const kToken = {__proto__: null};  // marks internal constructor calls; never handed out

  // ---- Small helpers. ----

  // A list with no prototype: index writes cannot reach a setter a tool put on Array.prototype.
  function newList() { return ObjectSetPrototypeOf([], null); }
  function cloneList(list) {
    const out = newList();
    for (let i = 0; i < list.length; i++) out[i] = list[i];
    return out;
  }
  // Concatenates a list's strings. Short lists are joined by hand: Array.prototype.join has no
  // fast path for a list without a prototype, and concatenation is cheap at that size.
  function joinList(list, separator) {
    const n = list.length;
    if (n > 64) return arrayJoin(list, separator);
    if (n === 0) return '';
    let out = list[0];
    for (let i = 1; i < n; i++) out = out + separator + list[i];
    return out;
  }
  function join(list) { return joinList(list, ''); }
  // The last index of code unit `c` in s[0, from], or -1.
  function lastIndexOfUnit(s, c, from) {
    if (lastIndexOf !== null) return lastIndexOf(s, fromCharCode(c), from);
    for (let i = from; i >= 0; i--) {
      if (charCodeAt(s, i) === c) return i;
    }
    return -1;
  }

  // A class of code units: some ASCII ones (`members`) and the range [low, high] above ASCII
  // (none when high is 0). scan() finds the next one in a string. Where it can, it lets the
  // engine search: a global regular expression of one character class, run with the captured
  // exec from `from` (a class cannot backtrack, so this is linear, and in the interpreter it is
  // many times faster than a loop). The regular expressions are the prelude's own, never handed
  // out.
  function charClass(members, low, high) {
    const table = new Uint8ArrayCtor(128);
    for (let i = 0; i < members.length; i++) table[charCodeAt(members, i)] = 1;
    let re = null;
    if (useRegExp) {
      let source = '';
      for (let c = 0; c < 128; c++) {
        if (table[c] === 1) source += '\\u' + hex4(c);
      }
      if (high !== 0) source += '\\u' + hex4(low) + '-\\u' + hex4(high);
      re = new RegExpCtor('[' + source + ']', 'g');
    }
    return {__proto__: null, table, low, high, re};
  }
  function hex4(value) {
    const digits = '0123456789abcdef';
    let out = '';
    for (let shift = 12; shift >= 0; shift -= 4) {
      out += fromCharCode(charCodeAt(digits, (value >> shift) & 15));
    }
    return out;
  }
  // Every ASCII code unit but those in `except`.
  function asciiExcept(except) {
    let out = '';
    for (let c = 0; c < 128; c++) {
      if (indexOf(except, fromCharCode(c)) < 0) out += fromCharCode(c);
    }
    return out;
  }
  // The index of the first code unit of `cls` in s at or after `from`, or s.length.
  function scan(cls, s, from) {
    const re = cls.re;
    if (re !== null) {
      re.lastIndex = from;
      const match = regExpExec(re, s);
      return match === null ? s.length : match.index;
    }
    const n = s.length;
    const table = cls.table;
    const low = cls.low;
    const high = cls.high;
    for (let i = from; i < n; i++) {
      const c = charCodeAt(s, i);
      if (c < 128 ? table[c] === 1 : c >= low && c <= high) return i;
    }
    return n;
  }
  const ALL_ABOVE_ASCII = 0xFFFF;
  const CC_SURROGATE = charClass('', 0xD800, 0xDFFF);
  const CC_TAB_OR_NEWLINE = charClass('\t\n\r', 0, 0);
  const CC_NOT_CONTROL_OR_SPACE = charClass(asciiExcept(controlsAndSpace()), 0x80, ALL_ABOVE_ASCII);
  const CC_NOT_SCHEME = charClass(asciiExcept(
      'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.'), 0x80, ALL_ABOVE_ASCII);
  const CC_NOT_SLASH = charClass(asciiExcept('/\\'), 0x80, ALL_ABOVE_ASCII);
  const CC_NOT_DIGIT = charClass(asciiExcept('0123456789'), 0x80, ALL_ABOVE_ASCII);
  const CC_END_SPECIAL = charClass('/\\?#', 0, 0);  // ends an authority, file host or segment
  const CC_END = charClass('/?#', 0, 0);            // the same in a URL that is not special
  const CC_SLASH_SPECIAL = charClass('/\\', 0, 0);  // ends a path segment in a setter
  const CC_HOST_SPECIAL = charClass(':/\\?#[]', 0, 0);
  const CC_HOST = charClass(':/?#[]', 0, 0);
  const CC_QUERY_OR_FRAGMENT = charClass('?#', 0, 0);
  const CC_PERCENT_OR_PLUS = charClass('%+', 0, 0);
  const CC_UPPER_OR_NON_ASCII = charClass('ABCDEFGHIJKLMNOPQRSTUVWXYZ', 0x80, ALL_ABOVE_ASCII);
  const CC_NON_ASCII = charClass('', 0x80, ALL_ABOVE_ASCII);
  function controlsAndSpace() {
    let out = '';
    for (let c = 0; c <= 0x20; c++) out += fromCharCode(c);
    return out;
  }
  // A fresh array for tool code (index properties defined, not assigned).
  function toToolArray(list) {
    const out = [];
    for (let i = 0; i < list.length; i++) {
      ObjectDefineProperty(out, i, {
        __proto__: null, value: list[i], writable: true, enumerable: true, configurable: true,
      });
    }
    return out;
  }
  // Stable merge sort of a list by `less` (strict order).
  function stableSort(list, less) {
    const n = list.length;
    if (n < 2) return;
    let from = list;
    let to = newList();
    for (let width = 1; width < n; width *= 2) {
      for (let lo = 0; lo < n; lo += 2 * width) {
        const mid = lo + width < n ? lo + width : n;
        const hi = lo + 2 * width < n ? lo + 2 * width : n;
        let i = lo;
        let j = mid;
        let k = lo;
        while (i < mid && j < hi) to[k++] = less(from[j], from[i]) ? from[j++] : from[i++];
        while (i < mid) to[k++] = from[i++];
        while (j < hi) to[k++] = from[j++];
      }
      const swap = from;
      from = to;
      to = swap;
    }
    if (from !== list) {
      for (let i = 0; i < n; i++) list[i] = from[i];
    }
  }
  function fromCodePoint(cp) {
    if (cp < 0x10000) return fromCharCode(cp);
    cp -= 0x10000;
    return fromCharCode(0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
  }
  function argumentsError(what, needed, present) {
    return new TypeErrorCtor(what + ': ' + needed + ' argument' + (needed === 1 ? '' : 's') +
                             ' required, but only ' + present + ' present.');
  }
  function quoteForError(s) {
    if (s.length <= 100) return '"' + s + '"';
    let end = 100;
    const c = charCodeAt(s, end - 1);
    if (c >= 0xD800 && c <= 0xDBFF) end--;
    return '"' + stringSlice(s, 0, end) + '..."';
  }
  function invalidURL(input, base) {
    let message = 'Invalid URL: ' + quoteForError(input);
    if (base !== null) message += ' (base ' + quoteForError(base) + ')';
    return new TypeErrorCtor(message);
  }

  // WebIDL USVString: ToString (a Symbol throws), then lone surrogates become U+FFFD.
  function toUSVString(value) {
    const s = typeof value === 'string' ? value : `${value}`;
    const first = scan(CC_SURROGATE, s, 0);
    return first === s.length ? s : replaceLoneSurrogates(s, first);
  }
  function replaceLoneSurrogates(s, from) {
    const parts = newList();
    const n = s.length;
    let run = 0;
    for (let i = from; i < n; i = scan(CC_SURROGATE, s, i + 1)) {
      const c = charCodeAt(s, i);
      if (c <= 0xDBFF && i + 1 < n) {
        const d = charCodeAt(s, i + 1);
        if (d >= 0xDC00 && d <= 0xDFFF) {
          i++;
          continue;
        }
      }
      if (i > run) parts[parts.length] = stringSlice(s, run, i);
      parts[parts.length] = '\uFFFD';
      run = i + 1;
    }
    if (run < n) parts[parts.length] = stringSlice(s, run, n);
    return join(parts);
  }

  // ---- Code points and percent-encode sets. ----
  const EOF = -1;
  const SPACE = 0x20, HASH = 0x23, PERCENT = 0x25, PLUS = 0x2B, DOT = 0x2E, SLASH = 0x2F;
  const COLON = 0x3A, QUESTION = 0x3F, LBRACKET = 0x5B, BACKSLASH = 0x5C, RBRACKET = 0x5D;
  const PIPE = 0x7C;

  // One bit per percent-encode set; each set holds every non-ASCII code point as well.
  const C0_SET = 1, FRAGMENT_SET = 2, QUERY_SET = 4, SPECIAL_QUERY_SET = 8, PATH_SET = 16;
  const USERINFO_SET = 32, COMPONENT_SET = 64, FORM_SET = 128;
  const ENCODE = new Uint8ArrayCtor(128);
  // Code-point classes for hosts.
  const FORBIDDEN_HOST = 1, FORBIDDEN_DOMAIN = 2;
  const HOSTCHAR = new Uint8ArrayCtor(128);
  const HEX = newList();  // "%00" ... "%FF"
  {
    const digits = '0123456789ABCDEF';
    for (let b = 0; b < 256; b++) {
      HEX[b] = '%' + fromCharCode(charCodeAt(digits, b >> 4), charCodeAt(digits, b & 15));
    }
    const mark = (chars, bits) => {
      for (let i = 0; i < chars.length; i++) ENCODE[charCodeAt(chars, i)] |= bits;
    };
    for (let c = 0; c < 0x20; c++) ENCODE[c] = 255;
    ENCODE[0x7F] = 255;
    const fromQuery = QUERY_SET | SPECIAL_QUERY_SET | PATH_SET | USERINFO_SET | COMPONENT_SET |
                      FORM_SET;
    const fromPath = PATH_SET | USERINFO_SET | COMPONENT_SET | FORM_SET;
    const fromUserinfo = USERINFO_SET | COMPONENT_SET | FORM_SET;
    mark(' "<>', FRAGMENT_SET | fromQuery);
    mark('`', FRAGMENT_SET | fromPath);
    mark('#', fromQuery);
    mark('\'', SPECIAL_QUERY_SET | FORM_SET);
    mark('?{}', fromPath);
    mark('/:;=@[\\]^|', fromUserinfo);
    mark('$%&+,', COMPONENT_SET | FORM_SET);
    mark('!()~', FORM_SET);

    const forbiddenHost = '\0\t\n\r #/:<>?@[\\]^|';
    for (let i = 0; i < forbiddenHost.length; i++) {
      HOSTCHAR[charCodeAt(forbiddenHost, i)] = FORBIDDEN_HOST | FORBIDDEN_DOMAIN;
    }
    for (let c = 0; c < 0x20; c++) HOSTCHAR[c] |= FORBIDDEN_DOMAIN;
    HOSTCHAR[PERCENT] |= FORBIDDEN_DOMAIN;
    HOSTCHAR[0x7F] |= FORBIDDEN_DOMAIN;
  }
  // The class of the ASCII code units of `table` that have `bits`, and if nonAscii of all above.
  function classOf(table, bits, nonAscii) {
    let members = '';
    for (let c = 0; c < 128; c++) {
      if ((table[c] & bits) !== 0) members += fromCharCode(c);
    }
    return nonAscii ? charClass(members, 0x80, ALL_ABOVE_ASCII) : charClass(members, 0, 0);
  }
  const ENCODE_CLASS = newList();  // by percent-encode set
  for (let bits = 1; bits <= FORM_SET; bits *= 2) ENCODE_CLASS[bits] = classOf(ENCODE, bits, true);
  const CC_FORBIDDEN_HOST = classOf(HOSTCHAR, FORBIDDEN_HOST, false);
  const CC_FORBIDDEN_DOMAIN = classOf(HOSTCHAR, FORBIDDEN_DOMAIN, false);

  function isAsciiAlpha(c) { return (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A); }
  function isAsciiDigit(c) { return c >= 0x30 && c <= 0x39; }
  function hexValue(c) {
    if (c >= 0x30 && c <= 0x39) return c - 0x30;
    if (c >= 0x41 && c <= 0x46) return c - 0x37;
    if (c >= 0x61 && c <= 0x66) return c - 0x57;
    return -1;
  }

  // UTF-8 percent-encodes s[start, end) with a percent-encode set (space as "+" if spaceAsPlus).
  // Unchanged runs are sliced, so the common case allocates nothing but the result. The range is
  // cut out first so that a scan never runs past it (which would make a path of many segments
  // quadratic).
  function percentEncode(s, start, end, set, spaceAsPlus) {
    if (start !== 0 || end !== s.length) s = stringSlice(s, start, end);
    const n = s.length;
    const cls = ENCODE_CLASS[set];
    let i = scan(cls, s, 0);
    if (i === n) return s;
    const parts = newList();
    let run = 0;
    for (; i < n; i = scan(cls, s, run)) {
      const c = charCodeAt(s, i);
      if (i > run) parts[parts.length] = stringSlice(s, run, i);
      if (c < 0x80) {
        parts[parts.length] = spaceAsPlus && c === SPACE ? '+' : HEX[c];
      } else if (c < 0x800) {
        parts[parts.length] = HEX[0xC0 | (c >> 6)];
        parts[parts.length] = HEX[0x80 | (c & 0x3F)];
      } else {
        let cp = c;
        if (c >= 0xD800 && c <= 0xDFFF) {
          const d = i + 1 < n ? charCodeAt(s, i + 1) : 0;
          if (c <= 0xDBFF && d >= 0xDC00 && d <= 0xDFFF) {
            cp = ((c - 0xD800) << 10) + (d - 0xDC00) + 0x10000;
            i++;
          } else {
            cp = 0xFFFD;
          }
        }
        if (cp >= 0x10000) {
          parts[parts.length] = HEX[0xF0 | (cp >> 18)];
          parts[parts.length] = HEX[0x80 | ((cp >> 12) & 0x3F)];
        } else {
          parts[parts.length] = HEX[0xE0 | (cp >> 12)];
        }
        parts[parts.length] = HEX[0x80 | ((cp >> 6) & 0x3F)];
        parts[parts.length] = HEX[0x80 | (cp & 0x3F)];
      }
      run = i + 1;
    }
    if (run < n) parts[parts.length] = stringSlice(s, run, n);
    return join(parts);
  }
  function percentEncodeString(s, set) { return percentEncode(s, 0, s.length, set, false); }

  // The Encoding Standard's UTF-8 decoder over bytes[0, n): appends the decoded strings to `out`.
  // A malformed sequence becomes U+FFFD, or (strict) makes it return false.
  function utf8Decode(bytes, n, out, strict) {
    let needed = 0;
    let seen = 0;
    let cp = 0;
    let lower = 0x80;
    let upper = 0xBF;
    for (let i = 0; i < n;) {
      const b = bytes[i];
      if (needed === 0) {
        i++;
        if (b < 0x80) {
          out[out.length] = fromCharCode(b);
        } else if (b >= 0xC2 && b <= 0xDF) {
          needed = 1;
          cp = b & 0x1F;
        } else if (b >= 0xE0 && b <= 0xEF) {
          if (b === 0xE0) lower = 0xA0;
          if (b === 0xED) upper = 0x9F;
          needed = 2;
          cp = b & 0xF;
        } else if (b >= 0xF0 && b <= 0xF4) {
          if (b === 0xF0) lower = 0x90;
          if (b === 0xF4) upper = 0x8F;
          needed = 3;
          cp = b & 0x7;
        } else {
          if (strict) return false;
          out[out.length] = '\uFFFD';
        }
        continue;
      }
      if (b < lower || b > upper) {
        // The byte is processed again as the start of a sequence.
        if (strict) return false;
        needed = seen = cp = 0;
        lower = 0x80;
        upper = 0xBF;
        out[out.length] = '\uFFFD';
        continue;
      }
      i++;
      lower = 0x80;
      upper = 0xBF;
      cp = (cp << 6) | (b & 0x3F);
      seen++;
      if (seen === needed) {
        out[out.length] = fromCodePoint(cp);
        needed = seen = cp = 0;
      }
    }
    if (needed !== 0) {
      if (strict) return false;
      out[out.length] = '\uFFFD';
    }
    return true;
  }

  // Percent-decodes s[start, end) and UTF-8 decodes the bytes; "+" becomes a space first when
  // plusAsSpace. Runs without "%" are sliced as they are: a string's own code points encode and
  // decode to themselves, and a byte sequence cut short by one decodes as it would in one stream.
  // Null when strict and the bytes are not UTF-8.
  function percentDecode(s, start, end, plusAsSpace, strict) {
    if (start !== 0 || end !== s.length) s = stringSlice(s, start, end);
    const n = s.length;
    const next = (from) => {
      if (plusAsSpace) return scan(CC_PERCENT_OR_PLUS, s, from);
      const at = indexOf(s, '%', from);
      return at < 0 ? n : at;
    };
    let i = next(0);
    if (i === n) return s;
    const parts = newList();
    let bytes = null;
    let run = 0;
    while (i < n) {
      if (charCodeAt(s, i) === PLUS) {
        if (i > run) parts[parts.length] = stringSlice(s, run, i);
        parts[parts.length] = ' ';
        run = i + 1;
        i = next(run);
        continue;
      }
      const h = i + 2 < n ? hexValue(charCodeAt(s, i + 1)) : -1;
      const l = h >= 0 ? hexValue(charCodeAt(s, i + 2)) : -1;
      if (l < 0) {
        i = next(i + 1);
        continue;
      }
      if (i > run) parts[parts.length] = stringSlice(s, run, i);
      if (bytes === null) bytes = newList();
      let count = 0;
      bytes[count++] = h * 16 + l;
      i += 3;
      while (i + 2 < n && charCodeAt(s, i) === PERCENT) {
        const h2 = hexValue(charCodeAt(s, i + 1));
        const l2 = hexValue(charCodeAt(s, i + 2));
        if (h2 < 0 || l2 < 0) break;
        bytes[count++] = h2 * 16 + l2;
        i += 3;
      }
      if (!utf8Decode(bytes, count, parts, strict)) return null;
      run = i;
      i = next(i);
    }
    if (run < n) parts[parts.length] = stringSlice(s, run, n);
    return join(parts);
  }

  // ---- Hosts. ----

  // Domain to ASCII, simplified: ASCII is lower-cased; other code points are mapped one by one
  // (full-width ASCII to ASCII, ideographic and full-width full stops to ".", default-ignorable
  // code points removed, controls, spaces, private use and noncharacters refused, the rest
  // lower-cased with toLowerCase), the result is NFC-normalized where String.prototype.normalize
  // can, and labels with non-ASCII code points become "xn--" + Punycode. The full UTS #46
  // mapping table, its validity rules (combining marks, joiners, bidi) and IDNA length limits are
  // out of scope. An ASCII "xn--" label must decode as Punycode to code points this mapping
  // would keep.
  function isIgnoredCodePoint(cp) {
    return cp === 0xAD || cp === 0x34F || (cp >= 0x180B && cp <= 0x180D) || cp === 0x180F ||
           cp === 0x200B || cp === 0x2060 || cp === 0x2064 || (cp >= 0xFE00 && cp <= 0xFE0F) ||
           cp === 0xFEFF || (cp >= 0x1BCA0 && cp <= 0x1BCA3) || (cp >= 0xE0100 && cp <= 0xE01EF);
  }
  // Controls, spaces, format characters, fillers, private use, noncharacters, tags.
  function isDisallowedCodePoint(cp) {
    return cp <= 0x9F || cp === 0xA0 || cp === 0x61C || cp === 0x115F || cp === 0x1160 ||
           cp === 0x1680 || cp === 0x17B4 || cp === 0x17B5 || cp === 0x1806 || cp === 0x180E ||
           (cp >= 0x2000 && cp <= 0x200A) || (cp >= 0x200C && cp <= 0x200F) ||
           (cp >= 0x2028 && cp <= 0x202F) || cp === 0x205F || (cp >= 0x2061 && cp <= 0x2063) ||
           (cp >= 0x2065 && cp <= 0x206F) || cp === 0x3000 || cp === 0x3164 ||
           (cp >= 0xD800 && cp <= 0xF8FF) || (cp >= 0xFDD0 && cp <= 0xFDEF) || cp === 0xFFA0 ||
           (cp >= 0xFFF0 && cp <= 0xFFFD) || (cp & 0xFFFE) === 0xFFFE ||
           (cp >= 0x1D173 && cp <= 0x1D17A) || (cp >= 0xE0000 && cp <= 0xE0FFF) || cp >= 0xF0000;
  }
  // Maps a domain with non-ASCII code points; null if one is refused.
  function mapDomain(s) {
    const out = newList();
    const n = s.length;
    for (let i = 0; i < n; i++) {
      const c = charCodeAt(s, i);
      if (c < 0x80) {
        out[out.length] = fromCharCode(c >= 0x41 && c <= 0x5A ? c + 0x20 : c);
        continue;
      }
      let cp = c;
      let width = 1;
      if (c >= 0xD800 && c <= 0xDBFF && i + 1 < n) {
        const d = charCodeAt(s, i + 1);
        if (d >= 0xDC00 && d <= 0xDFFF) {
          cp = ((c - 0xD800) << 10) + (d - 0xDC00) + 0x10000;
          width = 2;
        }
      }
      if (cp >= 0xFF01 && cp <= 0xFF5E) {
        const a = cp - 0xFEE0;
        out[out.length] = fromCharCode(a >= 0x41 && a <= 0x5A ? a + 0x20 : a);
      } else if (cp === 0x3002 || cp === 0xFF61) {
        out[out.length] = '.';
      } else if (isIgnoredCodePoint(cp)) {
        // removed
      } else if (isDisallowedCodePoint(cp)) {
        return null;
      } else {
        out[out.length] = toLowerCase(stringSlice(s, i, i + width));
      }
      i += width - 1;
    }
    const mapped = join(out);
    return normalize === null ? mapped : normalize(mapped, 'NFC');
  }

  // Punycode (RFC 3492).
  const PUNY_BASE = 36, PUNY_TMIN = 1, PUNY_TMAX = 26, PUNY_SKEW = 38, PUNY_DAMP = 700;
  const PUNY_MAXINT = 0x7FFFFFFF;
  function punyAdapt(delta, numPoints, firstTime) {
    delta = firstTime ? MathFloor(delta / PUNY_DAMP) : MathFloor(delta / 2);
    delta += MathFloor(delta / numPoints);
    let k = 0;
    while (delta > ((PUNY_BASE - PUNY_TMIN) * PUNY_TMAX) / 2) {
      delta = MathFloor(delta / (PUNY_BASE - PUNY_TMIN));
      k += PUNY_BASE;
    }
    return k + MathFloor(((PUNY_BASE - PUNY_TMIN + 1) * delta) / (delta + PUNY_SKEW));
  }
  function punyThreshold(k, bias) {
    if (k <= bias) return PUNY_TMIN;
    if (k >= bias + PUNY_TMAX) return PUNY_TMAX;
    return k - bias;
  }
  function punyDigit(d) { return fromCharCode(d < 26 ? d + 0x61 : d + 0x16); }
  // Encodes the code points of s[start, end). The counts of smaller code points between
  // occurrences come from a Fenwick tree, so a long label costs n log n, not n squared.
  function punycodeEncode(s, start, end) {
    const cps = newList();
    for (let i = start; i < end; i++) {
      const c = charCodeAt(s, i);
      if (c >= 0xD800 && c <= 0xDBFF && i + 1 < end) {
        const d = charCodeAt(s, i + 1);
        if (d >= 0xDC00 && d <= 0xDFFF) {
          cps[cps.length] = ((c - 0xD800) << 10) + (d - 0xDC00) + 0x10000;
          i++;
          continue;
        }
      }
      cps[cps.length] = c;
    }
    const length = cps.length;
    const out = newList();
    const tree = newList();
    for (let i = 0; i <= length; i++) tree[i] = 0;
    const mark = (pos) => {
      for (let x = pos + 1; x <= length; x += x & -x) tree[x]++;
    };
    const countBefore = (pos) => {  // marked positions < pos
      let sum = 0;
      for (let x = pos; x > 0; x -= x & -x) sum += tree[x];
      return sum;
    };
    const order = newList();
    for (let i = 0; i < length; i++) {
      if (cps[i] < 0x80) {
        out[out.length] = fromCharCode(cps[i]);
        mark(i);
      } else {
        order[order.length] = i;
      }
    }
    const basic = out.length;
    if (basic > 0) out[out.length] = '-';
    stableSort(order, (a, b) => cps[a] < cps[b]);
    let h = basic;
    let n = 0x80;
    let delta = 0;
    let bias = 72;
    let k = 0;
    while (k < order.length) {
      const m = cps[order[k]];
      delta += (m - n) * (h + 1);
      n = m;
      let previous = 0;
      let g = k;
      for (; g < order.length && cps[order[g]] === m; g++) {
        const pos = order[g];
        delta += countBefore(pos) - countBefore(previous);
        let q = delta;
        for (let kk = PUNY_BASE;; kk += PUNY_BASE) {
          const t = punyThreshold(kk, bias);
          if (q < t) break;
          out[out.length] = punyDigit(t + ((q - t) % (PUNY_BASE - t)));
          q = MathFloor((q - t) / (PUNY_BASE - t));
        }
        out[out.length] = punyDigit(q);
        bias = punyAdapt(delta, h + 1, h === basic);
        delta = 0;
        h++;
        previous = pos + 1;
      }
      delta += countBefore(length) - countBefore(previous);
      for (let x = k; x < g; x++) mark(order[x]);
      k = g;
      delta++;
      n++;
    }
    return join(out);
  }
  // Whether a code point decoded from an "xn--" label is one the domain mapping would keep.
  function isKeptCodePoint(cp) {
    if (cp > 0x10FFFF || isDisallowedCodePoint(cp) || isIgnoredCodePoint(cp)) return false;
    if ((cp >= 0xFF01 && cp <= 0xFF5E) || cp === 0x3002 || cp === 0xFF61) return false;
    const ch = fromCodePoint(cp);
    return toLowerCase(ch) === ch;
  }
  // Whether s[start, end), the part of a label after "xn--", decodes as Punycode.
  function punycodeValid(s, start, end) {
    let delimiter = lastIndexOfUnit(s, 0x2D, end - 1);
    if (delimiter < start) delimiter = -1;
    let count = delimiter === -1 ? 0 : delimiter - start;
    let index = delimiter === -1 ? start : delimiter + 1;
    if (count === 0 && index === end) return false;  // decodes to the empty label
    let i = 0;
    let n = 0x80;
    let bias = 72;
    while (index < end) {
      const oldi = i;
      let w = 1;
      for (let k = PUNY_BASE;; k += PUNY_BASE) {
        if (index >= end) return false;
        const c = charCodeAt(s, index++);
        let digit = -1;
        if (c >= 0x30 && c <= 0x39) digit = c - 0x16;
        else if (c >= 0x41 && c <= 0x5A) digit = c - 0x41;
        else if (c >= 0x61 && c <= 0x7A) digit = c - 0x61;
        if (digit < 0) return false;
        if (digit > MathFloor((PUNY_MAXINT - i) / w)) return false;
        i += digit * w;
        const t = punyThreshold(k, bias);
        if (digit < t) break;
        if (w > MathFloor(PUNY_MAXINT / (PUNY_BASE - t))) return false;
        w *= PUNY_BASE - t;
      }
      count++;
      bias = punyAdapt(i - oldi, count, oldi === 0);
      if (MathFloor(i / count) > PUNY_MAXINT - n) return false;
      n += MathFloor(i / count);
      i %= count;
      if (!isKeptCodePoint(n)) return false;
      i++;
    }
    return true;
  }
  function startsWithPunycodePrefix(s, start, end) {
    return end - start >= 4 && (charCodeAt(s, start) | 0x20) === 0x78 &&
           (charCodeAt(s, start + 1) | 0x20) === 0x6E && charCodeAt(s, start + 2) === 0x2D &&
           charCodeAt(s, start + 3) === 0x2D;
  }
  // Whether a label of an ASCII lower-case domain starts with "xn--".
  function hasPunycodeLabel(s) {
    for (let at = indexOf(s, 'xn--', 0); at >= 0; at = indexOf(s, 'xn--', at + 1)) {
      if (at === 0 || charCodeAt(s, at - 1) === DOT) return true;
    }
    return false;
  }
  function domainToASCII(domain) {
    const n = domain.length;
    let mapped = domain;
    const first = scan(CC_UPPER_OR_NON_ASCII, domain, 0);
    if (first < n) {
      if (scan(CC_NON_ASCII, domain, first) < n) {
        mapped = mapDomain(domain);
        if (mapped === null) return null;
      } else {
        mapped = toLowerCase(domain);
      }
    }
    const m = mapped.length;
    let nonAscii = scan(CC_NON_ASCII, mapped, 0);
    // The common case: nothing but ASCII lower-casing.
    if (nonAscii === m && !hasPunycodeLabel(mapped)) return m === 0 ? null : mapped;
    const labels = newList();
    for (let start = 0; start <= m;) {
      let end = indexOf(mapped, '.', start);
      if (end < 0) end = m;
      if (nonAscii < start) nonAscii = scan(CC_NON_ASCII, mapped, start);
      const prefixed = startsWithPunycodePrefix(mapped, start, end);
      if (nonAscii >= end) {
        if (prefixed && !punycodeValid(mapped, start + 4, end)) return null;
        labels[labels.length] = stringSlice(mapped, start, end);
      } else {
        if (prefixed) return null;
        labels[labels.length] = 'xn--' + punycodeEncode(mapped, start, end);
      }
      start = end + 1;
    }
    const result = joinList(labels, '.');
    return result === '' ? null : result;
  }

  // The IPv4 number parser on s[start, end): the value (at most 2^32, larger values saturate) or
  // -1 for failure.
  function parseIPv4Number(s, start, end) {
    if (start === end) return -1;
    let radix = 10;
    if (end - start >= 2 && charCodeAt(s, start) === 0x30 &&
        (charCodeAt(s, start + 1) | 0x20) === 0x78) {
      radix = 16;
      start += 2;
    } else if (end - start >= 2 && charCodeAt(s, start) === 0x30) {
      radix = 8;
      start += 1;
    }
    let value = 0;
    for (let i = start; i < end; i++) {
      const d = hexValue(charCodeAt(s, i));
      if (d < 0 || d >= radix) return -1;
      value = value * radix + d;
      if (value > 0x100000000) value = 0x100000000;
    }
    return value;
  }
  function endsInANumber(s) {
    let end = s.length;
    if (end > 0 && charCodeAt(s, end - 1) === DOT) end--;
    if (end === 0) return false;
    const start = lastIndexOfUnit(s, DOT, end - 1) + 1;
    if (start === end) return false;
    return scan(CC_NOT_DIGIT, s, start) >= end || parseIPv4Number(s, start, end) >= 0;
  }
  function parseIPv4(s) {
    const numbers = newList();
    const n = s.length;
    let end = n;
    if (n > 0 && charCodeAt(s, n - 1) === DOT) end = n - 1;  // one trailing empty part is dropped
    let start = 0;
    for (let i = 0; i <= end; i++) {
      if (i < end && charCodeAt(s, i) !== DOT) continue;
      if (numbers.length === 4) return null;
      const value = parseIPv4Number(s, start, i);
      if (value < 0) return null;
      numbers[numbers.length] = value;
      start = i + 1;
    }
    const count = numbers.length;
    for (let i = 0; i < count - 1; i++) {
      if (numbers[i] > 255) return null;
    }
    let limit = 1;
    for (let i = count; i < 5; i++) limit *= 256;
    if (numbers[count - 1] >= limit) return null;
    let address = numbers[count - 1];
    let factor = 256 * 256 * 256;
    for (let i = 0; i < count - 1; i++) {
      address += numbers[i] * factor;
      factor /= 256;
    }
    return (address >>> 24) + '.' + ((address >>> 16) & 255) + '.' + ((address >>> 8) & 255) +
           '.' + (address & 255);
  }

  function hexLower(value) {
    const digits = '0123456789abcdef';
    let out = '';
    do {
      out = fromCharCode(charCodeAt(digits, value & 15)) + out;
      value >>>= 4;
    } while (value !== 0);
    return out;
  }
  // The IPv6 parser on s[start, end): the serialized address with its brackets, or null.
  function parseIPv6(s, start, end) {
    const address = newList();
    for (let i = 0; i < 8; i++) address[i] = 0;
    let pieceIndex = 0;
    let compress = -1;
    let p = start;
    const at = (i) => (i < end ? charCodeAt(s, i) : EOF);
    if (at(p) === COLON) {
      if (at(p + 1) !== COLON) return null;
      p += 2;
      pieceIndex++;
      compress = pieceIndex;
    }
    while (at(p) !== EOF) {
      if (pieceIndex === 8) return null;
      if (at(p) === COLON) {
        if (compress !== -1) return null;
        p++;
        pieceIndex++;
        compress = pieceIndex;
        continue;
      }
      let value = 0;
      let length = 0;
      while (length < 4 && hexValue(at(p)) >= 0) {
        value = value * 16 + hexValue(at(p));
        p++;
        length++;
      }
      if (at(p) === DOT) {
        if (length === 0) return null;
        p -= length;
        if (pieceIndex > 6) return null;
        let numbersSeen = 0;
        while (at(p) !== EOF) {
          let ipv4Piece = -1;
          if (numbersSeen > 0) {
            if (at(p) === DOT && numbersSeen < 4) p++;
            else return null;
          }
          if (!isAsciiDigit(at(p))) return null;
          while (isAsciiDigit(at(p))) {
            const number = at(p) - 0x30;
            if (ipv4Piece === -1) ipv4Piece = number;
            else if (ipv4Piece === 0) return null;
            else ipv4Piece = ipv4Piece * 10 + number;
            if (ipv4Piece > 255) return null;
            p++;
          }
          address[pieceIndex] = address[pieceIndex] * 0x100 + ipv4Piece;
          numbersSeen++;
          if (numbersSeen === 2 || numbersSeen === 4) pieceIndex++;
        }
        if (numbersSeen !== 4) return null;
        break;
      } else if (at(p) === COLON) {
        p++;
        if (at(p) === EOF) return null;
      } else if (at(p) !== EOF) {
        return null;
      }
      address[pieceIndex] = value;
      pieceIndex++;
    }
    if (compress !== -1) {
      let swaps = pieceIndex - compress;
      pieceIndex = 7;
      while (pieceIndex !== 0 && swaps > 0) {
        const other = compress + swaps - 1;
        const piece = address[pieceIndex];
        address[pieceIndex] = address[other];
        address[other] = piece;
        pieceIndex--;
        swaps--;
      }
    } else if (pieceIndex !== 8) {
      return null;
    }
    // Serialize, compressing the first longest run (of two or more) of zero pieces.
    let best = -1;
    let bestLength = 1;
    for (let i = 0; i < 8;) {
      if (address[i] !== 0) {
        i++;
        continue;
      }
      let j = i;
      while (j < 8 && address[j] === 0) j++;
      if (j - i > bestLength) {
        best = i;
        bestLength = j - i;
      }
      i = j;
    }
    let out = '[';
    for (let i = 0; i < 8; i++) {
      if (i === best) {
        out += i === 0 ? '::' : ':';
        i += bestLength - 1;
        continue;
      }
      out += hexLower(address[i]);
      if (i !== 7) out += ':';
    }
    return out + ']';
  }

  // The host parser: the serialized host ("" for an empty host) or null for failure.
  function parseHost(input, isOpaque) {
    const n = input.length;
    if (n > 0 && charCodeAt(input, 0) === LBRACKET) {
      if (charCodeAt(input, n - 1) !== RBRACKET || n < 2) return null;
      return parseIPv6(input, 1, n - 1);
    }
    if (isOpaque) {
      if (scan(CC_FORBIDDEN_HOST, input, 0) < n) return null;
      return percentEncodeString(input, C0_SET);
    }
    const domain = percentDecode(input, 0, n, false, true);
    if (domain === null) return null;
    const ascii = domainToASCII(domain);
    if (ascii === null || scan(CC_FORBIDDEN_DOMAIN, ascii, 0) < ascii.length) return null;
    if (endsInANumber(ascii)) return parseIPv4(ascii);
    return ascii;
  }

  // ---- URL records. ----

  class URLRecord {
    scheme = '';
    username = '';
    password = '';
    host = null;   // null, or the serialized host ("" for an empty host)
    port = null;   // null or an integer
    path = newList();  // a list of segments, or a string for an opaque path
    query = null;
    fragment = null;
  }
  function copyRecord(to, from) {
    to.scheme = from.scheme;
    to.username = from.username;
    to.password = from.password;
    to.host = from.host;
    to.port = from.port;
    to.path = from.path;
    to.query = from.query;
    to.fragment = from.fragment;
  }

  function defaultPort(scheme) {
    switch (scheme) {
      case 'http': case 'ws': return 80;
      case 'https': case 'wss': return 443;
      case 'ftp': return 21;
      default: return null;
    }
  }
  function isSpecialScheme(scheme) {
    switch (scheme) {
      case 'http': case 'https': case 'ws': case 'wss': case 'ftp': case 'file': return true;
      default: return false;
    }
  }
  function hasOpaquePath(url) { return typeof url.path === 'string'; }
  function includesCredentials(url) { return url.username !== '' || url.password !== ''; }
  function cannotHaveCredentialsOrPort(url) {
    return url.host === null || url.host === '' || url.scheme === 'file';
  }
  function isWindowsDriveLetter(s) {
    if (s.length !== 2 || !isAsciiAlpha(charCodeAt(s, 0))) return false;
    const c = charCodeAt(s, 1);
    return c === COLON || c === PIPE;
  }
  function isNormalizedWindowsDriveLetter(s) {
    return s.length === 2 && isAsciiAlpha(charCodeAt(s, 0)) && charCodeAt(s, 1) === COLON;
  }
  function startsWithWindowsDriveLetter(s, p, n) {
    if (n - p < 2 || !isAsciiAlpha(charCodeAt(s, p))) return false;
    const second = charCodeAt(s, p + 1);
    if (second !== COLON && second !== PIPE) return false;
    if (n - p === 2) return true;
    const third = charCodeAt(s, p + 2);
    return third === SLASH || third === BACKSLASH || third === QUESTION || third === HASH;
  }
  function isPercent2e(s, i) {
    return charCodeAt(s, i) === PERCENT && charCodeAt(s, i + 1) === 0x32 &&
           (charCodeAt(s, i + 2) | 0x20) === 0x65;
  }
  function isSingleDotSegment(s) {
    const n = s.length;
    return (n === 1 && charCodeAt(s, 0) === DOT) || (n === 3 && isPercent2e(s, 0));
  }
  function isDoubleDotSegment(s) {
    switch (s.length) {
      case 2: return charCodeAt(s, 0) === DOT && charCodeAt(s, 1) === DOT;
      case 4: return (charCodeAt(s, 0) === DOT && isPercent2e(s, 1)) ||
                     (isPercent2e(s, 0) && charCodeAt(s, 3) === DOT);
      case 6: return isPercent2e(s, 0) && isPercent2e(s, 3);
      default: return false;
    }
  }
  function shortenPath(url) {
    const path = url.path;
    if (url.scheme === 'file' && path.length === 1 && isNormalizedWindowsDriveLetter(path[0])) {
      return;
    }
    if (path.length > 0) path.length = path.length - 1;
  }
  function appendSegment(url, segment) {
    const path = url.path;
    path[path.length] = segment;
  }
  function stripTrailingSpacesFromOpaquePath(url) {
    if (!hasOpaquePath(url) || url.fragment !== null || url.query !== null) return;
    const path = url.path;
    let end = path.length;
    while (end > 0 && charCodeAt(path, end - 1) === SPACE) end--;
    if (end !== path.length) url.path = stringSlice(path, 0, end);
  }

  // Leading and trailing C0 controls and spaces are removed from a whole URL.
  function trimControlsAndSpaces(s) {
    const start = scan(CC_NOT_CONTROL_OR_SPACE, s, 0);
    let end = s.length;
    while (end > start && charCodeAt(s, end - 1) <= SPACE) end--;
    return start === 0 && end === s.length ? s : stringSlice(s, start, end);
  }
  function removeTabsAndNewlines(s) {
    const n = s.length;
    let i = scan(CC_TAB_OR_NEWLINE, s, 0);
    if (i === n) return s;
    const parts = newList();
    let run = 0;
    for (; i < n; i = scan(CC_TAB_OR_NEWLINE, s, run)) {
      if (i > run) parts[parts.length] = stringSlice(s, run, i);
      run = i + 1;
    }
    if (run < n) parts[parts.length] = stringSlice(s, run, n);
    return join(parts);
  }

  // ---- The basic URL parser. ----
  const NO_OVERRIDE = 0, SCHEME_START = 1, SCHEME = 2, NO_SCHEME = 3;
  const SPECIAL_RELATIVE_OR_AUTHORITY = 4, PATH_OR_AUTHORITY = 5, RELATIVE = 6;
  const RELATIVE_SLASH = 7, SPECIAL_AUTHORITY_SLASHES = 8, SPECIAL_AUTHORITY_IGNORE_SLASHES = 9;
  const AUTHORITY = 10, HOST = 11, HOSTNAME = 12, PORT = 13, FILE = 14, FILE_SLASH = 15;
  const FILE_HOST = 16, PATH_START = 17, PATH = 18, OPAQUE_PATH = 19, QUERY = 20, FRAGMENT = 21;

  // Follows the standard's state machine. Where a state only collects code points up to a
  // delimiter (authority, host, port, path segment, opaque path, query, fragment) it finds the
  // delimiter and takes the slice, which gives the same result as going one code point at a time.
  // Without `url` it returns a new record or null; with `url` and a state override it changes
  // `url` in place (also when it then fails, as the standard's setters do) and its return value
  // only tells failure (null) from the rest.
  function basicParse(input, base, url, stateOverride) {
    if (url === null) {
      url = new URLRecord();
      input = trimControlsAndSpaces(input);
    }
    input = removeTabsAndNewlines(input);
    const n = input.length;
    const override = stateOverride !== NO_OVERRIDE;
    let state = override ? stateOverride : SCHEME_START;
    let pointer = 0;
    let bufferStart = 0;
    let driveLetter = '';  // a file host that was a Windows drive letter, carried into the path
    for (;;) {
      const c = pointer < n ? charCodeAt(input, pointer) : EOF;
      switch (state) {
        case SCHEME_START:
          if (isAsciiAlpha(c)) {
            state = SCHEME;
            bufferStart = pointer;
          } else if (!override) {
            state = NO_SCHEME;
            pointer--;
          } else {
            return null;
          }
          break;

        case SCHEME: {
          const end = scan(CC_NOT_SCHEME, input, pointer);
          if (end < n && charCodeAt(input, end) === COLON) {
            const buffer = toLowerCase(stringSlice(input, bufferStart, end));
            if (override) {
              if (isSpecialScheme(url.scheme) !== isSpecialScheme(buffer)) return url;
              if ((includesCredentials(url) || url.port !== null) && buffer === 'file') return url;
              if (url.scheme === 'file' && url.host === '') return url;
            }
            url.scheme = buffer;
            if (override) {
              if (url.port === defaultPort(buffer)) url.port = null;
              return url;
            }
            pointer = end;
            if (buffer === 'file') {
              state = FILE;
            } else if (isSpecialScheme(buffer) && base !== null && base.scheme === buffer) {
              state = SPECIAL_RELATIVE_OR_AUTHORITY;
            } else if (isSpecialScheme(buffer)) {
              state = SPECIAL_AUTHORITY_SLASHES;
            } else if (pointer + 1 < n && charCodeAt(input, pointer + 1) === SLASH) {
              state = PATH_OR_AUTHORITY;
              pointer++;
            } else {
              url.path = '';
              state = OPAQUE_PATH;
            }
          } else if (!override) {
            state = NO_SCHEME;
            pointer = -1;  // start over from the first code point
          } else {
            return null;
          }
          break;
        }

        case NO_SCHEME:
          if (base === null || (hasOpaquePath(base) && c !== HASH)) return null;
          if (hasOpaquePath(base)) {
            url.scheme = base.scheme;
            url.path = base.path;
            url.query = base.query;
            url.fragment = '';
            state = FRAGMENT;
          } else if (base.scheme !== 'file') {
            state = RELATIVE;
            pointer--;
          } else {
            state = FILE;
            pointer--;
          }
          break;

        case SPECIAL_RELATIVE_OR_AUTHORITY:
          if (c === SLASH && pointer + 1 < n && charCodeAt(input, pointer + 1) === SLASH) {
            state = SPECIAL_AUTHORITY_IGNORE_SLASHES;
            pointer++;
          } else {
            state = RELATIVE;
            pointer--;
          }
          break;

        case PATH_OR_AUTHORITY:
          if (c === SLASH) {
            state = AUTHORITY;
          } else {
            state = PATH;
            pointer--;
          }
          break;

        case RELATIVE:
          url.scheme = base.scheme;
          if (c === SLASH || (c === BACKSLASH && isSpecialScheme(url.scheme))) {
            state = RELATIVE_SLASH;
          } else {
            url.username = base.username;
            url.password = base.password;
            url.host = base.host;
            url.port = base.port;
            url.path = cloneList(base.path);
            url.query = base.query;
            if (c === QUESTION) {
              url.query = '';
              state = QUERY;
            } else if (c === HASH) {
              url.fragment = '';
              state = FRAGMENT;
            } else if (c !== EOF) {
              url.query = null;
              shortenPath(url);
              state = PATH;
              pointer--;
            }
          }
          break;

        case RELATIVE_SLASH:
          if (isSpecialScheme(url.scheme) && (c === SLASH || c === BACKSLASH)) {
            state = SPECIAL_AUTHORITY_IGNORE_SLASHES;
          } else if (c === SLASH) {
            state = AUTHORITY;
          } else {
            url.username = base.username;
            url.password = base.password;
            url.host = base.host;
            url.port = base.port;
            state = PATH;
            pointer--;
          }
          break;

        case SPECIAL_AUTHORITY_SLASHES:
          state = SPECIAL_AUTHORITY_IGNORE_SLASHES;
          if (c === SLASH && pointer + 1 < n && charCodeAt(input, pointer + 1) === SLASH) {
            pointer++;
          } else {
            pointer--;
          }
          break;

        case SPECIAL_AUTHORITY_IGNORE_SLASHES:
          pointer = scan(CC_NOT_SLASH, input, pointer) - 1;  // the slashes are skipped
          state = AUTHORITY;
          break;

        case AUTHORITY: {
          // Userinfo is everything before the last "@" ahead of the authority's end; each "@" in
          // it is encoded as "%40" and its first ":" splits username from password.
          const end = scan(isSpecialScheme(url.scheme) ? CC_END_SPECIAL : CC_END, input, pointer);
          const lastAt = end > pointer ? lastIndexOfUnit(input, 0x40, end - 1) : -1;
          if (lastAt >= pointer) {
            let colon = indexOf(input, ':', pointer);
            if (colon < 0 || colon > lastAt) colon = lastAt;
            url.username += percentEncode(input, pointer, colon, USERINFO_SET, false);
            if (colon < lastAt) {
              url.password += percentEncode(input, colon + 1, lastAt, USERINFO_SET, false);
            }
            if (lastAt + 1 === end) return null;  // credentials without a host
            pointer = lastAt;
          } else {
            pointer--;
          }
          state = HOST;
          break;
        }

        case HOST:
        case HOSTNAME: {
          if (override && url.scheme === 'file') {
            pointer--;
            state = FILE_HOST;
            break;
          }
          const special = isSpecialScheme(url.scheme);
          const stops = special ? CC_HOST_SPECIAL : CC_HOST;
          let end = scan(stops, input, pointer);
          let insideBrackets = false;
          for (; end < n; end = scan(stops, input, end + 1)) {
            const d = charCodeAt(input, end);
            if (d === LBRACKET) insideBrackets = true;
            else if (d === RBRACKET) insideBrackets = false;
            else if (d !== COLON || !insideBrackets) break;
          }
          if (end < n && charCodeAt(input, end) === COLON) {
            if (end === pointer) return null;
            if (stateOverride === HOSTNAME) return url;
            const host = parseHost(stringSlice(input, pointer, end), !special);
            if (host === null) return null;
            url.host = host;
            state = PORT;
            pointer = end;
          } else {
            if (special && end === pointer) return null;
            if (override && end === pointer && (includesCredentials(url) || url.port !== null)) {
              return url;
            }
            const host = parseHost(stringSlice(input, pointer, end), !special);
            if (host === null) return null;
            url.host = host;
            state = PATH_START;
            pointer = end - 1;
            if (override) return url;
          }
          break;
        }

        case PORT: {
          const end = scan(CC_NOT_DIGIT, input, pointer);
          let value = 0;
          for (let i = pointer; i < end && value <= 65535; i++) {
            value = value * 10 + (charCodeAt(input, i) - 0x30);
          }
          const d = end < n ? charCodeAt(input, end) : EOF;
          if (d === EOF || d === SLASH || d === QUESTION || d === HASH ||
              (d === BACKSLASH && isSpecialScheme(url.scheme)) || override) {
            if (end !== pointer) {
              if (value > 65535) return null;
              url.port = value === defaultPort(url.scheme) ? null : value;
            }
            if (override) return url;
            state = PATH_START;
            pointer = end - 1;
          } else {
            return null;
          }
          break;
        }

        case FILE:
          url.scheme = 'file';
          url.host = '';
          if (c === SLASH || c === BACKSLASH) {
            state = FILE_SLASH;
          } else if (base !== null && base.scheme === 'file') {
            url.host = base.host;
            url.path = cloneList(base.path);
            url.query = base.query;
            if (c === QUESTION) {
              url.query = '';
              state = QUERY;
            } else if (c === HASH) {
              url.fragment = '';
              state = FRAGMENT;
            } else if (c !== EOF) {
              url.query = null;
              if (!startsWithWindowsDriveLetter(input, pointer, n)) shortenPath(url);
              else url.path = newList();
              state = PATH;
              pointer--;
            }
          } else {
            state = PATH;
            pointer--;
          }
          break;

        case FILE_SLASH:
          if (c === SLASH || c === BACKSLASH) {
            state = FILE_HOST;
          } else {
            if (base !== null && base.scheme === 'file') {
              url.host = base.host;
              if (!startsWithWindowsDriveLetter(input, pointer, n) && base.path.length > 0 &&
                  isNormalizedWindowsDriveLetter(base.path[0])) {
                appendSegment(url, base.path[0]);
              }
            }
            state = PATH;
            pointer--;
          }
          break;

        case FILE_HOST: {
          const end = scan(CC_END_SPECIAL, input, pointer);
          const buffer = stringSlice(input, pointer, end);
          pointer = end - 1;
          if (!override && isWindowsDriveLetter(buffer)) {
            driveLetter = buffer;
            state = PATH;
          } else if (buffer === '') {
            url.host = '';
            if (override) return url;
            state = PATH_START;
          } else {
            let host = parseHost(buffer, !isSpecialScheme(url.scheme));
            if (host === null) return null;
            if (host === 'localhost') host = '';
            url.host = host;
            if (override) return url;
            state = PATH_START;
          }
          break;
        }

        case PATH_START:
          if (isSpecialScheme(url.scheme)) {
            state = PATH;
            if (c !== SLASH && c !== BACKSLASH) pointer--;
          } else if (!override && c === QUESTION) {
            url.query = '';
            state = QUERY;
          } else if (!override && c === HASH) {
            url.fragment = '';
            state = FRAGMENT;
          } else if (c !== EOF) {
            state = PATH;
            if (c !== SLASH) pointer--;
          } else if (override && url.host === null) {
            appendSegment(url, '');
          }
          break;

        case PATH: {
          // One segment per run of this state.
          const special = isSpecialScheme(url.scheme);
          let end;
          if (!override) {
            end = scan(special ? CC_END_SPECIAL : CC_END, input, pointer);
          } else if (special) {
            end = scan(CC_SLASH_SPECIAL, input, pointer);
          } else {
            end = indexOf(input, '/', pointer);
            if (end < 0) end = n;
          }
          let buffer = percentEncode(input, pointer, end, PATH_SET, false);
          if (driveLetter !== '') {
            buffer = driveLetter + buffer;
            driveLetter = '';
          }
          const d = end < n ? charCodeAt(input, end) : EOF;
          const slash = d === SLASH || (special && d === BACKSLASH);
          if (isDoubleDotSegment(buffer)) {
            shortenPath(url);
            if (!slash) appendSegment(url, '');
          } else if (isSingleDotSegment(buffer)) {
            if (!slash) appendSegment(url, '');
          } else {
            if (url.scheme === 'file' && url.path.length === 0 && isWindowsDriveLetter(buffer)) {
              buffer = stringSlice(buffer, 0, 1) + ':';
            }
            appendSegment(url, buffer);
          }
          if (d === QUESTION) {
            url.query = '';
            state = QUERY;
          } else if (d === HASH) {
            url.fragment = '';
            state = FRAGMENT;
          }
          pointer = end;
          break;
        }

        case OPAQUE_PATH: {
          const end = scan(CC_QUERY_OR_FRAGMENT, input, pointer);
          url.path += percentEncode(input, pointer, end, C0_SET, false);
          const d = end < n ? charCodeAt(input, end) : EOF;
          if (d === QUESTION) {
            url.query = '';
            state = QUERY;
          } else if (d === HASH) {
            url.fragment = '';
            state = FRAGMENT;
          }
          pointer = end;
          break;
        }

        case QUERY: {
          let end = override ? -1 : indexOf(input, '#', pointer);
          if (end < 0) end = n;
          const set = isSpecialScheme(url.scheme) ? SPECIAL_QUERY_SET : QUERY_SET;
          url.query += percentEncode(input, pointer, end, set, false);
          if (end < n) {
            url.fragment = '';
            state = FRAGMENT;
          }
          pointer = end;
          break;
        }

        case FRAGMENT:
          url.fragment += percentEncode(input, pointer, n, FRAGMENT_SET, false);
          pointer = n;
          break;
      }
      if (pointer >= n) break;
      pointer++;
    }
    return url;
  }

  // The API URL parser: a record, or null for failure (of the base or of the URL).
  function apiParse(input, base) {
    let parsedBase = null;
    if (base !== null) {
      parsedBase = basicParse(base, null, null, NO_OVERRIDE);
      if (parsedBase === null) return null;
    }
    return basicParse(input, parsedBase, null, NO_OVERRIDE);
  }

  function serializePath(url) {
    const path = url.path;
    if (typeof path === 'string') return path;
    if (path.length === 0) return '';
    return '/' + joinList(path, '/');
  }
  function serializeURL(url) {
    let out = url.scheme + ':';
    if (url.host !== null) {
      out += '//';
      if (includesCredentials(url)) {
        out += url.username;
        if (url.password !== '') out += ':' + url.password;
        out += '@';
      }
      out += url.host;
      if (url.port !== null) out += ':' + url.port;
    } else if (!hasOpaquePath(url) && url.path.length > 1 && url.path[0] === '') {
      out += '/.';
    }
    out += serializePath(url);
    if (url.query !== null) out += '?' + url.query;
    if (url.fragment !== null) out += '#' + url.fragment;
    return out;
  }
  function serializeOrigin(url) {
    switch (url.scheme) {
      case 'blob': {
        const inner = basicParse(serializePath(url), null, null, NO_OVERRIDE);
        if (inner !== null && (inner.scheme === 'http' || inner.scheme === 'https')) {
          return serializeOrigin(inner);
        }
        return 'null';
      }
      case 'ftp': case 'http': case 'https': case 'ws': case 'wss':
        return url.scheme + '://' + url.host + (url.port === null ? '' : ':' + url.port);
      default:
        return 'null';
    }
  }

  // ---- application/x-www-form-urlencoded. ----

  function parseFormEncoded(s) {
    const list = newList();
    const n = s.length;
    let start = 0;
    let equals = -1;  // the next "=" at or after start (kept across pairs: linear)
    while (start <= n) {
      let end = indexOf(s, '&', start);
      if (end < 0) end = n;
      if (equals < start) {
        equals = indexOf(s, '=', start);
        if (equals < 0) equals = n + 1;
      }
      if (end > start) {
        const name = percentDecode(s, start, equals < end ? equals : end, true, false);
        const value = equals < end ? percentDecode(s, equals + 1, end, true, false) : '';
        list[list.length] = {name, value};
      }
      start = end + 1;
    }
    return list;
  }
  function serializeFormEncoded(list) {
    const parts = newList();
    for (let i = 0; i < list.length; i++) {
      const entry = list[i];
      if (i > 0) parts[parts.length] = '&';
      parts[parts.length] = percentEncode(entry.name, 0, entry.name.length, FORM_SET, true);
      parts[parts.length] = '=';
      parts[parts.length] = percentEncode(entry.value, 0, entry.value.length, FORM_SET, true);
    }
    return join(parts);
  }

  // ---- The API. ----

  // Set by URLSearchParams's static block: the way URL reaches a URLSearchParams's state.
  let linkSearchParams;     // (params, record): the record its changes update
  let replaceSearchParams;  // (params, list)
  let searchParamsList;     // (params) => list

  function defineHidden(object, key, value) {
    ObjectDefineProperty(object, key, {
      __proto__: null, value, writable: false, enumerable: false, configurable: true,
    });
  }
  // WebIDL members are enumerable, which class syntax does not make them.
  function makeEnumerable(object, skipConstructor) {
    const keys = ReflectOwnKeys(object);
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i];
      if (typeof key !== 'string' || (skipConstructor && key === 'constructor')) continue;
      if (key === 'length' || key === 'name' || key === 'prototype') continue;
      ObjectDefineProperty(object, key, {__proto__: null, enumerable: true});
    }
  }

  class URL {
    #url;          // the URL record
    #query = null;  // the URLSearchParams object, made on first use, kept in step with the query

    constructor(url, base = undefined) {
      let record;
      if (url === kToken) {
        record = base;  // URL.parse hands over a record it parsed
      } else {
        if (arguments.length < 1) throw argumentsError("Failed to construct 'URL'", 1, 0);
        const input = toUSVString(url);
        const baseString = base === undefined ? null : toUSVString(base);
        record = apiParse(input, baseString);
        if (record === null) throw invalidURL(input, baseString);
      }
      this.#url = record;
    }

    // Sets the list of the searchParams object (if made yet) from the URL's query.
    #queryChanged() {
      const query = this.#query;
      if (query === null) return;
      const value = this.#url.query;
      replaceSearchParams(query, value === null ? newList() : parseFormEncoded(value));
    }

    static parse(url, base = undefined) {
      if (arguments.length < 1) throw argumentsError("Failed to execute 'parse' on 'URL'", 1, 0);
      const input = toUSVString(url);
      const record = apiParse(input, base === undefined ? null : toUSVString(base));
      return record === null ? null : new URL(kToken, record);
    }
    static canParse(url, base = undefined) {
      if (arguments.length < 1) {
        throw argumentsError("Failed to execute 'canParse' on 'URL'", 1, 0);
      }
      const input = toUSVString(url);
      return apiParse(input, base === undefined ? null : toUSVString(base)) !== null;
    }

    get href() { return serializeURL(this.#url); }
    set href(value) {
      const url = this.#url;
      const input = toUSVString(value);
      const parsed = basicParse(input, null, null, NO_OVERRIDE);
      if (parsed === null) throw invalidURL(input, null);
      copyRecord(url, parsed);
      this.#queryChanged();
    }
    get origin() { return serializeOrigin(this.#url); }
    get protocol() { return this.#url.scheme + ':'; }
    set protocol(value) {
      const url = this.#url;
      basicParse(toUSVString(value) + ':', null, url, SCHEME_START);
    }
    get username() { return this.#url.username; }
    set username(value) {
      const url = this.#url;
      const input = toUSVString(value);
      if (cannotHaveCredentialsOrPort(url)) return;
      url.username = percentEncodeString(input, USERINFO_SET);
    }
    get password() { return this.#url.password; }
    set password(value) {
      const url = this.#url;
      const input = toUSVString(value);
      if (cannotHaveCredentialsOrPort(url)) return;
      url.password = percentEncodeString(input, USERINFO_SET);
    }
    get host() {
      const url = this.#url;
      if (url.host === null) return '';
      return url.port === null ? url.host : url.host + ':' + url.port;
    }
    set host(value) {
      const url = this.#url;
      const input = toUSVString(value);
      if (hasOpaquePath(url)) return;
      basicParse(input, null, url, HOST);
    }
    get hostname() {
      const host = this.#url.host;
      return host === null ? '' : host;
    }
    set hostname(value) {
      const url = this.#url;
      const input = toUSVString(value);
      if (hasOpaquePath(url)) return;
      basicParse(input, null, url, HOSTNAME);
    }
    get port() {
      const port = this.#url.port;
      return port === null ? '' : '' + port;
    }
    set port(value) {
      const url = this.#url;
      const input = toUSVString(value);
      if (cannotHaveCredentialsOrPort(url)) return;
      if (input === '') url.port = null;
      else basicParse(input, null, url, PORT);
    }
    get pathname() { return serializePath(this.#url); }
    set pathname(value) {
      const url = this.#url;
      const input = toUSVString(value);
      if (hasOpaquePath(url)) return;
      url.path = newList();
      basicParse(input, null, url, PATH_START);
    }
    get search() {
      const query = this.#url.query;
      return query === null || query === '' ? '' : '?' + query;
    }
    set search(value) {
      const url = this.#url;
      const input = toUSVString(value);
      if (input === '') {
        url.query = null;
        this.#queryChanged();
        stripTrailingSpacesFromOpaquePath(url);
        return;
      }
      const query = charCodeAt(input, 0) === QUESTION ? stringSlice(input, 1) : input;
      url.query = '';
      basicParse(query, null, url, QUERY);
      // The list comes from the given value, as the standard says. It differs from what the
      // query would give only by tabs and newlines (removed from the query), so only then must
      // the searchParams object be made now rather than on first use.
      if (this.#query === null && removeTabsAndNewlines(query) !== query) this.#searchParams();
      if (this.#query !== null) replaceSearchParams(this.#query, parseFormEncoded(query));
    }
    get searchParams() { return this.#searchParams(); }
    #searchParams() {
      let query = this.#query;
      if (query === null) {
        query = new URLSearchParams();
        linkSearchParams(query, this.#url);
        this.#query = query;
        this.#queryChanged();
      }
      return query;
    }
    get hash() {
      const fragment = this.#url.fragment;
      return fragment === null || fragment === '' ? '' : '#' + fragment;
    }
    set hash(value) {
      const url = this.#url;
      const input = toUSVString(value);
      if (input === '') {
        url.fragment = null;
        stripTrailingSpacesFromOpaquePath(url);
        return;
      }
      const fragment = charCodeAt(input, 0) === HASH ? stringSlice(input, 1) : input;
      url.fragment = '';
      basicParse(fragment, null, url, FRAGMENT);
    }
    toString() { return serializeURL(this.#url); }
    toJSON() { return serializeURL(this.#url); }
  }

  const KIND_KEYS = 0, KIND_VALUES = 1, KIND_ENTRIES = 2;

  class URLSearchParams {
    #list = newList();  // entries {name, value}, both USV strings
    #url = null;        // the URL record this object's changes update, or null

    constructor(init = '') {
      if ((typeof init === 'object' && init !== null) || typeof init === 'function') {
        const method = init[SymbolIterator];
        if (method !== undefined && method !== null) {
          if (typeof method !== 'function') {
            throw new TypeErrorCtor("Failed to construct 'URLSearchParams': " +
                                    'the object\'s Symbol.iterator is not a function');
          }
          this.#list = listFromPairs(init, method);
        } else {
          this.#list = listFromRecord(init);
        }
      } else {
        const s = toUSVString(init);
        this.#list = parseFormEncoded(s.length > 0 && charCodeAt(s, 0) === QUESTION
                                          ? stringSlice(s, 1) : s);
      }
    }

    static {
      linkSearchParams = (params, record) => { params.#url = record; };
      replaceSearchParams = (params, list) => { params.#list = list; };
      searchParamsList = (params) => params.#list;
    }

    #update() {
      const url = this.#url;
      if (url === null) return;
      const query = serializeFormEncoded(this.#list);
      url.query = query === '' ? null : query;
      if (query === '') stripTrailingSpacesFromOpaquePath(url);
    }

    get size() { return this.#list.length; }

    append(name, value) {
      this.#list;  // the receiver is checked before the arguments are converted
      if (arguments.length < 2) {
        throw argumentsError("Failed to execute 'append' on 'URLSearchParams'", 2,
                             arguments.length);
      }
      const entry = {name: toUSVString(name), value: toUSVString(value)};
      const list = this.#list;
      list[list.length] = entry;
      this.#update();
    }
    delete(name, value = undefined) {
      this.#list;
      if (arguments.length < 1) {
        throw argumentsError("Failed to execute 'delete' on 'URLSearchParams'", 1, 0);
      }
      const key = toUSVString(name);
      const only = value === undefined ? null : toUSVString(value);
      const list = this.#list;
      let kept = 0;
      for (let i = 0; i < list.length; i++) {
        const entry = list[i];
        if (entry.name === key && (only === null || entry.value === only)) continue;
        list[kept++] = entry;
      }
      list.length = kept;
      this.#update();
    }
    get(name) {
      this.#list;
      if (arguments.length < 1) {
        throw argumentsError("Failed to execute 'get' on 'URLSearchParams'", 1, 0);
      }
      const key = toUSVString(name);
      const list = this.#list;
      for (let i = 0; i < list.length; i++) {
        if (list[i].name === key) return list[i].value;
      }
      return null;
    }
    getAll(name) {
      this.#list;
      if (arguments.length < 1) {
        throw argumentsError("Failed to execute 'getAll' on 'URLSearchParams'", 1, 0);
      }
      const key = toUSVString(name);
      const list = this.#list;
      const values = newList();
      for (let i = 0; i < list.length; i++) {
        if (list[i].name === key) values[values.length] = list[i].value;
      }
      return toToolArray(values);
    }
    has(name, value = undefined) {
      this.#list;
      if (arguments.length < 1) {
        throw argumentsError("Failed to execute 'has' on 'URLSearchParams'", 1, 0);
      }
      const key = toUSVString(name);
      const only = value === undefined ? null : toUSVString(value);
      const list = this.#list;
      for (let i = 0; i < list.length; i++) {
        if (list[i].name === key && (only === null || list[i].value === only)) return true;
      }
      return false;
    }
    set(name, value) {
      this.#list;
      if (arguments.length < 2) {
        throw argumentsError("Failed to execute 'set' on 'URLSearchParams'", 2,
                             arguments.length);
      }
      const key = toUSVString(name);
      const newValue = toUSVString(value);
      const list = this.#list;
      let found = false;
      let kept = 0;
      for (let i = 0; i < list.length; i++) {
        const entry = list[i];
        if (entry.name === key) {
          if (found) continue;
          found = true;
          list[kept++] = {name: key, value: newValue};
        } else {
          list[kept++] = entry;
        }
      }
      if (!found) list[kept++] = {name: key, value: newValue};
      list.length = kept;
      this.#update();
    }
    sort() {
      stableSort(this.#list, (a, b) => a.name < b.name);
      this.#update();
    }
    forEach(callback, thisArg = undefined) {
      this.#list;
      if (arguments.length < 1) {
        throw argumentsError("Failed to execute 'forEach' on 'URLSearchParams'", 1, 0);
      }
      if (typeof callback !== 'function') {
        throw new TypeErrorCtor("Failed to execute 'forEach' on 'URLSearchParams': " +
                                'the callback is not a function');
      }
      // Live: entries added or removed by the callback are seen, as the WebIDL loop does.
      for (let i = 0; i < this.#list.length; i++) {
        const entry = this.#list[i];
        ReflectApply(callback, thisArg, [entry.value, entry.name, this]);
      }
    }
    keys() {
      this.#list;
      return new URLSearchParamsIterator(kToken, this, KIND_KEYS);
    }
    values() {
      this.#list;
      return new URLSearchParamsIterator(kToken, this, KIND_VALUES);
    }
    entries() {
      this.#list;
      return new URLSearchParamsIterator(kToken, this, KIND_ENTRIES);
    }
    toString() { return serializeFormEncoded(this.#list); }
  }

  // init as sequence<sequence<USVString>>, through the iterator protocol of the caller's object.
  function listFromPairs(object, method) {
    const list = newList();
    const iterator = ReflectApply(method, object, []);
    if ((typeof iterator !== 'object' || iterator === null) && typeof iterator !== 'function') {
      throw new TypeErrorCtor('the iterator is not an object');
    }
    const next = iterator.next;
    for (;;) {
      const result = ReflectApply(next, iterator, []);
      if ((typeof result !== 'object' || result === null) && typeof result !== 'function') {
        throw new TypeErrorCtor('the iterator result is not an object');
      }
      if (result.done) break;
      const pair = pairFromIterable(result.value);
      list[list.length] = {name: pair[0], value: pair[1]};
    }
    return list;
  }
  function pairFromIterable(value) {
    if ((typeof value !== 'object' || value === null) && typeof value !== 'function') {
      throw new TypeErrorCtor("Failed to construct 'URLSearchParams': " +
                              'each pair must be an iterable object');
    }
    const method = value[SymbolIterator];
    if (typeof method !== 'function') {
      throw new TypeErrorCtor("Failed to construct 'URLSearchParams': " +
                              'each pair must be an iterable object');
    }
    const items = newList();
    const iterator = ReflectApply(method, value, []);
    if ((typeof iterator !== 'object' || iterator === null) && typeof iterator !== 'function') {
      throw new TypeErrorCtor('the iterator is not an object');
    }
    const next = iterator.next;
    for (;;) {
      const result = ReflectApply(next, iterator, []);
      if ((typeof result !== 'object' || result === null) && typeof result !== 'function') {
        throw new TypeErrorCtor('the iterator result is not an object');
      }
      if (result.done) break;
      items[items.length] = toUSVString(result.value);
    }
    if (items.length !== 2) {
      throw new TypeErrorCtor("Failed to construct 'URLSearchParams': " +
                              'each pair must have exactly two items, not ' + items.length);
    }
    return items;
  }
  // init as record<USVString, USVString>: own enumerable keys, in property order.
  function listFromRecord(object) {
    const list = newList();
    const keys = ReflectOwnKeys(object);
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i];
      const descriptor = ReflectGetOwnPropertyDescriptor(object, key);
      if (descriptor === undefined || !descriptor.enumerable) continue;
      const name = toUSVString(key);
      const value = toUSVString(object[key]);
      // Two keys can become one name (lone surrogates); the record keeps the first position.
      let replaced = false;
      if (name !== key) {
        for (let j = 0; j < list.length; j++) {
          if (list[j].name === name) {
            list[j] = {name, value};
            replaced = true;
            break;
          }
        }
      }
      if (!replaced) list[list.length] = {name, value};
    }
    return list;
  }

  class URLSearchParamsIterator {
    #params;
    #kind;
    #index = 0;
    constructor(token, params, kind) {
      if (token !== kToken) throw new TypeErrorCtor('Illegal constructor');
      this.#params = params;
      this.#kind = kind;
    }
    next() {
      const list = searchParamsList(this.#params);
      const index = this.#index;
      if (index >= list.length) return {value: undefined, done: true};
      this.#index = index + 1;
      const entry = list[index];
      const kind = this.#kind;
      if (kind === KIND_KEYS) return {value: entry.name, done: false};
      if (kind === KIND_VALUES) return {value: entry.value, done: false};
      return {value: [entry.name, entry.value], done: false};
    }
  }

  // Shapes as WebIDL gives them: enumerable members, @@toStringTag, @@iterator === entries, an
  // iterator prototype that inherits %IteratorPrototype% and has no constructor.
  makeEnumerable(URL.prototype, true);
  makeEnumerable(URL, false);
  defineHidden(URL.prototype, SymbolToStringTag, 'URL');
  makeEnumerable(URLSearchParams.prototype, true);
  ObjectDefineProperty(URLSearchParams.prototype, SymbolIterator, {
    __proto__: null, value: URLSearchParams.prototype.entries, writable: true,
    enumerable: false, configurable: true,
  });
  defineHidden(URLSearchParams.prototype, SymbolToStringTag, 'URLSearchParams');
  const iteratorPrototype = URLSearchParamsIterator.prototype;
  delete iteratorPrototype.constructor;
  ObjectSetPrototypeOf(iteratorPrototype, IteratorPrototype);
  makeEnumerable(iteratorPrototype, true);
  defineHidden(iteratorPrototype, SymbolToStringTag, 'URLSearchParams Iterator');

  return (name) => {
    if (name === 'URL') return URL;
    if (name === 'URLSearchParams') return URLSearchParams;
    return undefined;
  };
}))JS";

}  // namespace toolhost::runtime
