// Drives a server with the official `openai` npm client, so the serving tests
// check Strata against a client nobody here wrote.
//
// Usage: node openai_client.mjs '<json>'   (or the JSON on stdin)
//
// Input:
//   {
//     "base_url": "http://127.0.0.1:PORT/v1",
//     "api_key": "...",                       // optional ("unused" when absent)
//     "calls": [                              // run in order
//       {"api": "chat" | "completions", "stream": false, "params": {...}},
//       {"api": "models"},
//       {"api": "conversation", "turns": ["first user message", "second"],
//        "stream": false, "params": {...}}     // multi-turn chat: each turn
//                                              // appends the user message, then
//                                              // the assistant's reply
//     ]
//   }
// `params` go to the client as given (model, messages/prompt, max_tokens, n,
// stop, stream_options, cache_salt, ...). The client never retries.
//
// Output (stdout, one JSON document):
//   {"results": [ <result per call> ]}
// A result is {"ok": true, "id", "object", "model", "choices": [{"index",
// "text", "finish_reason"}], "usage", "chunks"} (chunks: number of streamed
// chunks; usage from the final chunk when streaming), for a conversation
// {"ok": true, "turns": [result, ...]}, for models {"ok": true, "data": [...]},
// or {"ok": false, "status", "error", "message"} when the call failed.
// Exit code 0 unless the input itself is unusable.

import OpenAI from "openai";
import { readFileSync } from "node:fs";

function readInput() {
  const arg = process.argv[2];
  const text = arg !== undefined ? arg : readFileSync(0, "utf8");
  return JSON.parse(text);
}

function textOf(api, choice) {
  if (api === "chat") return choice.message?.content ?? "";
  return choice.text ?? "";
}

function deltaOf(api, choice) {
  if (api === "chat") return choice.delta?.content ?? "";
  return choice.text ?? "";
}

async function runOne(client, api, stream, params) {
  const endpoint = api === "chat" ? client.chat.completions : client.completions;
  if (!stream) {
    const r = await endpoint.create({ ...params, stream: false });
    return {
      ok: true,
      id: r.id,
      object: r.object,
      model: r.model,
      choices: r.choices.map((c) => ({
        index: c.index,
        text: textOf(api, c),
        finish_reason: c.finish_reason,
      })),
      usage: r.usage ?? null,
      chunks: 0,
    };
  }
  const s = await endpoint.create({ ...params, stream: true });
  const texts = new Map();
  const finish = new Map();
  let usage = null;
  let id = null;
  let object = null;
  let model = null;
  let chunks = 0;
  for await (const chunk of s) {
    ++chunks;
    id = chunk.id;
    object = chunk.object;
    model = chunk.model;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices ?? []) {
      texts.set(c.index, (texts.get(c.index) ?? "") + deltaOf(api, c));
      if (c.finish_reason) finish.set(c.index, c.finish_reason);
    }
  }
  const indices = [...new Set([...texts.keys(), ...finish.keys()])].sort((a, b) => a - b);
  return {
    ok: true,
    id,
    object,
    model,
    choices: indices.map((i) => ({
      index: i,
      text: texts.get(i) ?? "",
      finish_reason: finish.get(i) ?? null,
    })),
    usage,
    chunks,
  };
}

async function runConversation(client, call) {
  const params = { ...(call.params ?? {}) };
  const messages = [...(params.messages ?? [])];
  const turns = [];
  for (const user of call.turns) {
    messages.push({ role: "user", content: user });
    const r = await runOne(client, "chat", Boolean(call.stream), { ...params, messages: [...messages] });
    turns.push(r);
    messages.push({ role: "assistant", content: r.choices[0]?.text ?? "" });
  }
  return { ok: true, turns };
}

async function runCall(client, call) {
  try {
    if (call.api === "models") {
      const page = await client.models.list();
      return { ok: true, data: page.data };
    }
    if (call.api === "conversation") return await runConversation(client, call);
    if (call.api !== "chat" && call.api !== "completions") throw new Error(`unknown api '${call.api}'`);
    return await runOne(client, call.api, Boolean(call.stream), call.params ?? {});
  } catch (e) {
    if (e instanceof OpenAI.APIError) {
      return { ok: false, status: e.status ?? null, error: e.error ?? null, message: e.message };
    }
    return { ok: false, status: null, error: null, message: String(e?.stack ?? e) };
  }
}

async function main() {
  let input;
  try {
    input = readInput();
  } catch (e) {
    process.stderr.write(`openai_client: bad input: ${e}\n`);
    process.exit(2);
  }
  const client = new OpenAI({
    baseURL: input.base_url,
    apiKey: input.api_key ?? "unused",
    maxRetries: 0,
    timeout: (input.timeout_seconds ?? 120) * 1000,
  });
  const results = [];
  for (const call of input.calls ?? []) results.push(await runCall(client, call));
  process.stdout.write(JSON.stringify({ results }) + "\n");
}

main();
