// Writes varied strings and their token ids under a Hugging Face tokenizer (tokenizer.json +
// tokenizer_config.json, run by @lenml/tokenizers) as JSON lines {"text", "ids"}: the oracle
// specula's tokenizer is compared with (tests/reference/tokenizer_oracle.py).
// Usage: node tokenizer_oracle.mjs <node_modules> <dir with the two JSON files> <count> <out>
// (count random strings, then the text of every token of the vocabulary)
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, modelDir, countArg, outPath] = process.argv.slice(2);
const require = createRequire(resolve(nodeModules, "noop.js"));
const { TokenizerLoader } = await import(pathToFileURL(require.resolve("@lenml/tokenizers")).href);
const tokenizerJSON = JSON.parse(readFileSync(join(modelDir, "tokenizer.json")));
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON,
  tokenizerConfig: JSON.parse(readFileSync(join(modelDir, "tokenizer_config.json"))),
});
const nfc = tokenizerJSON.normalizer?.type === "NFC";

// A fixed sequence of pseudo-random numbers (xorshift32): the same strings on every run.
let state = 0x9e3779b9;
const rand = (n) => {
  state ^= state << 13; state >>>= 0;
  state ^= state >>> 17;
  state ^= state << 5; state >>>= 0;
  return state % n;
};
const pick = (list) => list[rand(list.length)];

const words = ["the", "The", "HELLO", "world", "don't", "I'm", "we'll", "THEY'RE", "it's", "you've",
  "he'd", "O'Neil", "naïve", "café", "résumé", "Straße", "über", "København", "tokenizer", "llama",
  "GPU", "fooBar", "snake_case", "x86_64", "v1.2.3", "e-mail", "https://example.com/a?b=c&d=e",
  "user@example.org", "C++20", "#include", "std::vector<int>", "->", "=>", "!=", "...", "—", "“quoted”",
  "«guillemets»", "¿Qué?", "¡Hola!", "Привет", "мир", "Ελληνικά", "日本語", "中文字符", "한국어", "ไทย",
  "हिन्दी", "العربية", "עברית", "🙂", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🤖🤖", "∑", "∞", "½", "²", "Ⅻ", "①", "٣", "१२३",
  "\u00a0", "\u3000", "\u200b", "'", "''", "'s", "'S", "'ll", "’s"];
const spaces = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "    ", "\t\t", " \t ",
  "\u00a0", "\u3000", "\u2009"];
const code = ["def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
  "if x==1:print('y')", "const re = /\\p{L}+/gu;", "{\"key\": [1, 2.5, -3e10, null]}",
  "SELECT * FROM t WHERE id = 42;", "<div class=\"a\">&nbsp;</div>", "#!/bin/bash\necho $HOME",
  "fn main() { println!(\"{}\", 1_000); }", "    \n    \n", "a=b+c*d/e-f%g^h|i&j~k"];
const number = () => {
  const forms = [() => String(rand(10)), () => String(rand(1000000007)), () => "0".repeat(1 + rand(5)),
    () => String(rand(100000)) + "." + String(rand(1000)), () => (rand(2) ? "-" : "+") + rand(99999),
    () => "1,234,567", () => "3.14159265358979", () => String(rand(10)).repeat(1 + rand(12))];
  return pick(forms)();
};
const piece = () => {
  switch (rand(6)) {
    case 0: case 1: return pick(words);
    case 2: return pick(spaces);
    case 3: return number();
    case 4: return pick(code);
    default: return String.fromCodePoint(0x20 + rand(0x2fff));  // any character of the BMP's start
  }
};
// U+FEFF is left out: ECMAScript's \s (this oracle's regexes) counts it as white space, Unicode's
// White_Space (Hugging Face's Rust tokenizers, PCRE2, specula) does not, so the oracle itself
// departs from the tokenizers it stands for there.
const withoutBom = (text) => text.replaceAll("\ufeff", "");

const count = Number(countArg);
const lines = [];
const fixed = ["", " ", "  ", "\n", "Hello world", " Hello world", "Hello World!", "12345678901234",
  "   leading and trailing   ", "tabs\tand\nnewlines\r\n", "🙂🙂🙂", "日本語のテキスト", "a'b'c"];
for (let i = 0; i < count; ++i) {
  let text = "";
  if (i < fixed.length) {
    text = fixed[i];
  } else {
    const n = 1 + rand(24);
    for (let k = 0; k < n; ++k) text += piece() + (rand(3) ? " " : "");
  }
  text = withoutBom(text);
  if (nfc) text = text.normalize("NFC");  // the normalizer the tokenizer runs first
  lines.push(JSON.stringify({ text, ids: tokenizer.encode(text, { add_special_tokens: false }) }));
}
// Then every token of the vocabulary as text: a word that is itself a token is that token when
// the tokenizer ignores merges (Llama 3), which random strings rarely reach.
// Special tokens (<s>, <|im_start|>) written in text are not parsed as such by specula: it
// tokenizes text as text, as llama.cpp does unless asked to parse them.
const special = new Set(tokenizerJSON.added_tokens.filter((t) => t.special).map((t) => t.content));
for (const [token, id] of Object.entries(tokenizerJSON.model.vocab)) {
  if (special.has(token)) continue;
  const text = withoutBom(tokenizer.decode([id]));
  if (text.includes("\ufffd") || (nfc && text !== text.normalize("NFC"))) continue;  // partial UTF-8
  lines.push(JSON.stringify({ text, ids: tokenizer.encode(text, { add_special_tokens: false }) }));
}
writeFileSync(outPath, lines.join("\n") + "\n");
