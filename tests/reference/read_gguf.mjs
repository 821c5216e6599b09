// Reads a GGUF file with @huggingface/gguf, an independent GGUF parser, and
// prints what it found as JSON: selected metadata, the tensor table and the
// parameter count. Strata's tests compare it with what Strata wrote.
// Usage: node read_gguf.mjs FILE.gguf
import { gguf } from "@huggingface/gguf";

const path = process.argv[2];
const out = await gguf(path, { allowLocalFile: true, computeParametersCount: true });
const md = out.metadata;
const pick = {};
for (const [k, v] of Object.entries(md)) {
  if (Array.isArray(v)) pick[k] = { array_length: v.length, first: v.slice(0, 3) };
  else pick[k] = typeof v === "bigint" ? Number(v) : v;
}
const tensors = out.tensorInfos.map((t) => ({
  name: t.name,
  type: Number(t.dtype),
  ne: t.shape.map((d) => Number(d)),
  offset: Number(t.offset),
}));
console.log(JSON.stringify({ metadata: pick, tensors, parameter_count: Number(out.parameterCount) }));
