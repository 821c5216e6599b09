#!/usr/bin/env node
// Renders chat templates with @huggingface/jinja, an independent Jinja
// implementation, so that Strata's C++ renderers (model/chat_template.cc) can be
// compared with what the model's own template produces.
//
// Usage: node render_chat.mjs [request.json]   (reads stdin when no file is given)
//
// Request:
//   {
//     "template": "<jinja text>",            // or "template_file": "<path>"
//     "bos_token": "<s>" | null,             // null or absent: left undefined
//     "eos_token": "</s>" | null,
//     "cases": [
//       { "messages": [{"role": "user", "content": "hi"}],
//         "add_generation_prompt": true,
//         "context": { "date_string": "02 Jan 2025" } }   // optional extra variables
//     ]
//   }
// Response (stdout): {"results": [{"text": "..."} | {"error": "..."}]}, one per case,
// in order. A template that calls raise_exception() gives {"error": message}.
// Exit status 0 when the request was understood, 2 otherwise (message on stderr).
//
// The context mirrors transformers' apply_chat_template: messages, tools=None,
// documents=None, add_generation_prompt, the special tokens, plus case.context.
//
// @huggingface/jinja differs from Python's Jinja (what transformers runs) in a
// few places: `'' != false` is false, strip/lstrip/rstrip ignore their
// argument, `trim` uses JavaScript's whitespace set. The C++ test knows these;
// see docs/chat-templates.md.

import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

function fail(message) {
  process.stderr.write(`render_chat: ${message}\n`);
  process.exit(2);
}

function tokenText(token) {
  // tokenizer_config.json may hold an AddedToken object instead of a string.
  if (token && typeof token === "object") return token.content;
  return token;
}

let raw;
try {
  raw = process.argv[2] ? readFileSync(process.argv[2], "utf8") : readFileSync(0, "utf8");
} catch (e) {
  fail(`cannot read request: ${e.message}`);
}

let request;
try {
  request = JSON.parse(raw);
} catch (e) {
  fail(`request is not JSON: ${e.message}`);
}

let source = request.template;
if (typeof source !== "string" && typeof request.template_file === "string") {
  try {
    source = readFileSync(request.template_file, "utf8");
  } catch (e) {
    fail(`cannot read template_file: ${e.message}`);
  }
}
if (typeof source !== "string") fail("request needs 'template' or 'template_file'");
if (!Array.isArray(request.cases)) fail("request needs a 'cases' array");

let template;
try {
  template = new Template(source);
} catch (e) {
  fail(`template does not parse: ${e.message}`);
}

const results = request.cases.map((c, i) => {
  if (!c || !Array.isArray(c.messages)) fail(`case ${i} needs a 'messages' array`);
  const context = {
    messages: c.messages,
    tools: null,
    documents: null,
    add_generation_prompt: c.add_generation_prompt ?? false,
  };
  const bos = tokenText(request.bos_token);
  const eos = tokenText(request.eos_token);
  if (bos !== null && bos !== undefined) context.bos_token = bos;
  if (eos !== null && eos !== undefined) context.eos_token = eos;
  Object.assign(context, c.context ?? {});
  try {
    return { text: template.render(context) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
});

process.stdout.write(JSON.stringify({ results }));
