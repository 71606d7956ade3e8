// Load on any server with OpenAI's API (specula-server, llama.cpp's llama-server): C clients,
// each sending R completion requests one after another, all clients at once; prints requests/s,
// generated tokens/s (the responses' usage) and the median and 95th percentile latency. The same
// script for every server, so that their figures compare.
//   node tools/bench_server.mjs --url http://127.0.0.1:8080 --clients 1,4,16 --requests 4 \
//        --max-tokens 32 [--temperature 0] [--chat]
const args = { url: "http://127.0.0.1:8080", clients: "1,4,16", requests: "4", "max-tokens": "32", temperature: "0" };
for (let i = 2; i < process.argv.length; ++i) {
  const key = process.argv[i].replace(/^--/, "");
  if (key === "chat") args.chat = true;
  else args[key] = process.argv[++i];
}
const prompts = [
  "Once upon a time",
  "def fibonacci(n):",
  "The capital of France is",
  "The json module can be used to",
  "import os\nimport sys\n",
  "In the beginning",
  "A list of the planets:",
  "Dear Sir or Madam,",
];

async function request(i) {
  const prompt = prompts[i % prompts.length];
  const body = { model: "m", max_tokens: Number(args["max-tokens"]), temperature: Number(args.temperature), seed: i };
  if (args.chat) body.messages = [{ role: "user", content: prompt }];
  else body.prompt = prompt;
  const t0 = performance.now();
  const r = await fetch(`${args.url}/v1/${args.chat ? "chat/completions" : "completions"}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${args["api-key"] ?? "none"}` },
    body: JSON.stringify(body),
  });
  const j = await r.json();
  if (!r.ok) throw new Error(`${r.status}: ${JSON.stringify(j)}`);
  return { tokens: j.usage.completion_tokens, ms: performance.now() - t0 };
}

const quantile = (xs, q) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(q * xs.length))];
console.log("| clients | requests | requests/s | generated tokens/s | latency median ms | latency p95 ms |");
console.log("|---|---|---|---|---|---|");
for (const clients of args.clients.split(",").map(Number)) {
  const latencies = [];
  let tokens = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: clients }, async (_, c) => {
      for (let k = 0; k < Number(args.requests); ++k) {
        const r = await request(c * 1000 + k);
        latencies.push(r.ms);
        tokens += r.tokens;
      }
    }),
  );
  const s = (performance.now() - t0) / 1000;
  console.log(
    `| ${clients} | ${latencies.length} | ${(latencies.length / s).toFixed(2)} | ${(tokens / s).toFixed(1)} | ${quantile(latencies, 0.5).toFixed(0)} | ${quantile(latencies, 0.95).toFixed(0)} |`,
  );
}
