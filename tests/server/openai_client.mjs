// specula-server driven by OpenAI's own Node client (the `openai` npm package, which
// tools/test.sh installs into build/npm): chat completions streamed and not, completions,
// transcriptions in every response format, errors in OpenAI's shape, the API key, a bounded
// load test (16 concurrent clients x 20 requests, every greedy output the single client's, the
// server's memory flat), requests past the queue refused with 429, and a client that
// disconnects stopping its generation. Greedy outputs are compared with specula-cli's and
// specula-asr's for the same prompt and audio: the server adds nothing to what the library
// generates.
// Usage: node openai_client.mjs --server S --cli C --asr A --models DIR --wav W --node-modules N
// Exit 77 (skipped) where the openai package is missing.
import { createRequire } from "node:module";
import { spawn, execFileSync } from "node:child_process";
import { readFileSync, createReadStream, existsSync } from "node:fs";
import { resolve, join } from "node:path";
import assert from "node:assert/strict";

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
const require = createRequire(resolve(args["node-modules"], "noop.js"));
let OpenAI;
try {
  OpenAI = require("openai");
} catch {
  console.log("the openai npm package is not installed: skipped");
  process.exit(77);
}
const target = join(args.models, "specula-demo-target.gguf");
const draft = join(args.models, "specula-demo-draft.gguf");
const asrTarget = join(args.models, "specula-whisper-target.bin");
const asrDraft = join(args.models, "specula-whisper-draft.bin");
const asrTokens = join(args.models, "specula-whisper-draft.tokens");
const emulator = args.emulator ? args.emulator.split(" ").filter((s) => s) : [];

const servers = [];
// Starts a server on a free port; resolves to {port, process} once it listens.
function startServer(extra) {
  return new Promise((resolvePromise, reject) => {
    const cmd = [...emulator, args.server, "-m", target, "--port", "0", "--backend", "cpu", ...extra];
    const child = spawn(cmd[0], cmd.slice(1), { stdio: ["ignore", "ignore", "pipe"] });
    servers.push(child);
    let log = "";
    child.stderr.on("data", (d) => {
      log += d;
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && !child.port) {
        child.port = Number(m[1]);
        resolvePromise(child);
      }
    });
    child.on("exit", (code) => reject(new Error(`server exited (${code}): ${log}`)));
  });
}
function stopAll() {
  for (const s of servers) s.kill("SIGKILL");
}
// A request may wait behind 15 others on a machine the rest of the suite also loads (2 cores, two
// tests at once): the client waits as long as the test may run.
const client = (port, opts = {}) =>
  new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "test-key", maxRetries: 0, timeout: 540000, ...opts });
const rssKiB = (pid) => Number(readFileSync(`/proc/${pid}/status`, "utf8").match(/VmRSS:\s+(\d+)/)[1]);
const health = async (port) => (await fetch(`http://127.0.0.1:${port}/health`)).json();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// What the library generates: specula-cli's greedy text (it prints the prompt, then the text).
function cliCompletion(prompt, n) {
  const out = execFileSync(args.cli, ["-m", target, "-md", draft, "--backend", "cpu", "-p", prompt, "-n", String(n), "--temp", "0"], {
    stdio: ["ignore", "pipe", "ignore"],
  }).toString();
  return out.replace(/\n$/, "");
}
function cliChat(message, n) {
  const out = execFileSync(args.cli, ["-m", target, "-md", draft, "--backend", "cpu", "-cnv", "--chat-template", "chatml", "-n", String(n), "--temp", "0"], {
    input: message + "\n",
    stdio: ["pipe", "pipe", "ignore"],
  }).toString();
  // "\n> " before the reply, "\n> " after it (the next turn's prompt)
  return out.slice(out.indexOf("\n> ") + 3, out.lastIndexOf("\n> "));
}

async function main() {
  const server = await startServer(["-md", draft, "--asr-model", asrTarget, "--asr-draft", asrDraft, "--asr-draft-tokens", asrTokens, "-np", "4", "--api-key", "test-key"]);
  const api = client(server.port);

  // The key is checked; /health is open.
  await assert.rejects(client(server.port, { apiKey: "wrong" }).models.list(), (e) => e.status === 401);
  assert.equal((await health(server.port)).status, "ok");
  const models = await api.models.list();
  assert.equal(models.data[0].id, "specula-demo-target.gguf");

  // Chat, not streamed and streamed: the library's greedy reply, and the same text in deltas.
  const messages = [{ role: "user", content: "Hello" }];
  const chat = await api.chat.completions.create({ model: "m", messages, max_tokens: 16, temperature: 0 });
  assert.equal(chat.object, "chat.completion");
  assert.equal(chat.choices[0].message.role, "assistant");
  assert.equal(chat.choices[0].message.content, cliChat("Hello", 16));
  assert.equal(chat.usage.completion_tokens, 16);
  assert.ok(chat.usage.prompt_tokens > 0);
  assert.ok(chat.usage.speculation.drafted > 0, "a draft model's drafts are reported");
  let streamed = "";
  let finish = null;
  let usage = null;
  const stream = await api.chat.completions.create({ model: "m", messages, max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true } });
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    streamed += chunk.choices[0].delta.content ?? "";
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.equal(streamed, chat.choices[0].message.content);
  assert.equal(finish, "length");
  assert.equal(usage.completion_tokens, 16);

  // Completions: the library's text after the prompt (echo gives both), and stop strings.
  const prompt = "The json module";
  const expected = cliCompletion(prompt, 24);
  const completion = await api.completions.create({ model: "m", prompt, max_tokens: 24, temperature: 0, echo: true });
  assert.equal(completion.choices[0].text, expected);
  const text = expected.slice(prompt.length);
  const stopAt = text.indexOf("module") > 0 ? "module" : text.slice(4, 7);
  const stopped = await api.completions.create({ model: "m", prompt, max_tokens: 24, temperature: 0, stop: [stopAt] });
  assert.equal(stopped.choices[0].text, text.slice(0, text.indexOf(stopAt)));
  assert.equal(stopped.choices[0].finish_reason, "stop");
  let streamedStop = "";
  for await (const chunk of await api.completions.create({ model: "m", prompt, max_tokens: 24, temperature: 0, stop: stopAt, stream: true }))
    streamedStop += chunk.choices[0]?.text ?? "";
  assert.equal(streamedStop, stopped.choices[0].text, "a streamed stop string is never sent");

  // Sampled: reproducible from the seed.
  const sampled = (seed) => api.completions.create({ model: "m", prompt, max_tokens: 16, temperature: 0.8, top_p: 0.95, seed });
  assert.equal((await sampled(7)).choices[0].text, (await sampled(7)).choices[0].text);

  // Transcriptions: specula-asr's text for the same clip with the same pair, in every format.
  const asrOut = execFileSync(args.asr, ["-m", asrTarget, "--md", asrDraft, "--draft-tokens", asrTokens, "--backend", "cpu", "-f", args.wav], {
    stdio: ["ignore", "pipe", "ignore"],
  }).toString();
  const asrText = asrOut
    .split("\n")
    .filter((l) => l.startsWith("["))
    .map((l) => l.replace(/^\[[^\]]*\]\s*/, ""))
    .join(" ")
    .trim();
  const transcript = await api.audio.transcriptions.create({ file: createReadStream(args.wav), model: "whisper-1" });
  assert.equal(transcript.text, asrText);
  const verbose = await api.audio.transcriptions.create({ file: createReadStream(args.wav), model: "whisper-1", response_format: "verbose_json" });
  assert.equal(verbose.text, asrText);
  assert.ok(verbose.segments.length >= 1 && verbose.duration > 1);
  const srt = await api.audio.transcriptions.create({ file: createReadStream(args.wav), model: "whisper-1", response_format: "srt" });
  assert.match(srt, /^1\n00:00:00,000 --> \d\d:\d\d:\d\d,\d\d\d\n/);
  const vtt = await api.audio.transcriptions.create({ file: createReadStream(args.wav), model: "whisper-1", response_format: "vtt" });
  assert.match(vtt, /^WEBVTT\n\n00:00:00\.000 --> /);
  // The same clip as MP3 (beside the WAV): decoded by libsndfile, the same words.
  const mp3 = await api.audio.transcriptions.create({ file: createReadStream(args.wav.replace(/\.wav$/, ".mp3")), model: "whisper-1" });
  assert.equal(mp3.text, asrText);

  // Errors in OpenAI's shape, never a crash.
  const post = (path, body, type = "application/json") =>
    fetch(`http://127.0.0.1:${server.port}/v1/${path}`, { method: "POST", headers: { "Content-Type": type, Authorization: "Bearer test-key" }, body });
  for (const [body, status] of [
    ["{not json", 400],
    [JSON.stringify({ messages: "hi" }), 400],
    [JSON.stringify({ messages: [{ role: "user", content: "x" }], temperature: "hot" }), 400],
    [JSON.stringify({ messages: [{ role: "user", content: "x" }], n: 2 }), 400],
    [JSON.stringify({ messages: [{ role: "user", content: "x" }], max_tokens: 1e9 }), 400],
    [JSON.stringify({ messages: [{ role: "wizard", content: "x" }] }), 400],
    [JSON.stringify({ messages: [{ role: "user", content: "x".repeat(20000) }], max_tokens: 8 }), 400],
  ]) {
    const r = await post("chat/completions", body);
    assert.equal(r.status, status, body.slice(0, 80));
    assert.equal(typeof (await r.json()).error.message, "string");
  }
  const badAudio = new FormData();
  badAudio.append("file", new Blob([Buffer.from("RIFF....WAVEjunk")]), "a.wav");
  const r = await fetch(`http://127.0.0.1:${server.port}/v1/audio/transcriptions`, { method: "POST", headers: { Authorization: "Bearer test-key" }, body: badAudio });
  assert.equal(r.status, 400);
  assert.equal((await fetch(`http://127.0.0.1:${server.port}/v1/nothing`, { headers: { Authorization: "Bearer test-key" } })).status, 404);
  assert.equal((await health(server.port)).status, "ok", "the server survives every refusal");

  // Load: 16 concurrent clients x 20 requests, every greedy output the single client's, memory flat.
  const prompts = ["Once upon a time", "def fibonacci(n):", "The capital of France is", "import os"];
  const single = {};
  for (const p of prompts) single[p] = (await api.completions.create({ model: "m", prompt: p, max_tokens: 12, temperature: 0 })).choices[0].text;
  const round = async () => {
    let errors = 0;
    await Promise.all(
      Array.from({ length: 16 }, async (_, c) => {
        for (let i = 0; i < 20; ++i) {
          const p = prompts[(c + i) % prompts.length];
          try {
            const out = await client(server.port).completions.create({ model: "m", prompt: p, max_tokens: 12, temperature: 0 });
            assert.equal(out.choices[0].text, single[p]);
          } catch (e) {
            ++errors;
            console.error(e.message);
          }
        }
      }),
    );
    return errors;
  };
  assert.equal(await round(), 0, "no request of the warm-up round fails");
  const rss0 = rssKiB(server.pid);
  assert.equal(await round(), 0, "no request fails");
  const rss1 = rssKiB(server.pid);
  console.log(`load: 2 x 320 requests, RSS ${rss0} -> ${rss1} KiB after the warm-up round`);
  assert.ok(rss1 - rss0 < 16 * 1024, `RSS grew ${rss1 - rss0} KiB`);

  // A small server: one slot, a queue of one; the rest are refused with 429.
  const small = await startServer(["-np", "1", "--queue", "1", "-c", "8192", "--max-tokens", "8000"]);
  const smallApi = client(small.port);
  const results = await Promise.allSettled(
    Array.from({ length: 8 }, () => smallApi.completions.create({ model: "m", prompt: "Once upon a time", max_tokens: 200, temperature: 0 })),
  );
  const refused = results.filter((x) => x.status === "rejected" && x.reason.status === 429).length;
  const served = results.filter((x) => x.status === "fulfilled").length;
  console.log(`queue: ${served} served, ${refused} refused with 429`);
  assert.equal(served + refused, 8);
  assert.ok(refused >= 1 && served >= 2);

  // A client that leaves stops its generation: the slot is free, and far fewer tokens were
  // generated than the whole request makes.
  const request = { model: "m", prompt: "Once upon a time", max_tokens: 8000, temperature: 0 };
  const whole = (await smallApi.completions.create(request)).usage.completion_tokens;
  assert.ok(whole > 2000, `the whole request makes ${whole} tokens`);
  const start = (await health(small.port)).tokens_generated;
  const controller = new AbortController();
  const long = await smallApi.completions.create({ ...request, stream: true }, { signal: controller.signal });
  try {
    for await (const chunk of long) {
      if (chunk.choices[0]?.text) break; // the first text, then leave
    }
  } catch {}
  controller.abort();
  let h = await health(small.port);
  for (let i = 0; i < 50 && h.slots_idle !== 1; ++i) {
    await sleep(100);
    h = await health(small.port);
  }
  assert.equal(h.slots_idle, 1, "the slot is released");
  const made = h.tokens_generated - start;
  console.log(`disconnect: the generation stopped after ${made} of ${whole} tokens`);
  assert.ok(made < whole / 2, `${made} of ${whole} tokens were generated for a client that left`);

  // The same for a response written whole: the client leaves while it waits.
  const before = (await health(small.port)).tokens_generated;
  const leaving = new AbortController();
  const pending = smallApi.completions.create(request, { signal: leaving.signal }).catch(() => null);
  await sleep(300);
  leaving.abort();
  await pending;
  h = await health(small.port);
  for (let i = 0; i < 50 && h.slots_idle !== 1; ++i) {
    await sleep(100);
    h = await health(small.port);
  }
  assert.equal(h.slots_idle, 1, "the slot is released");
  const madeWhole = h.tokens_generated - before;
  console.log(`disconnect (not streamed): the generation stopped after ${madeWhole} of ${whole} tokens`);
  assert.ok(madeWhole < whole / 2, `${madeWhole} of ${whole} tokens were generated for a client that left`);
}

main()
  .then(() => {
    stopAll();
    console.log("all server checks passed");
    process.exit(0);
  })
  .catch((e) => {
    stopAll();
    console.error(e);
    process.exit(1);
  });
