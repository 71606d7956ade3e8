// Token ids of texts under a Hugging Face tokenizer (tokenizer.json + tokenizer_config.json, run
// by @lenml/tokenizers), special tokens written in the texts parsed as those tokens and nothing
// added: the oracle of the ids of chat templates' texts (tests/reference/chat_oracle.py).
// Usage: node encode_oracle.mjs <node_modules> <model dir> <texts.json> <ids.json>
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, modelDir, textsPath, idsPath] = process.argv.slice(2);
const require = createRequire(resolve(nodeModules, "noop.js"));
const { TokenizerLoader } = await import(pathToFileURL(require.resolve("@lenml/tokenizers")).href);
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(join(modelDir, "tokenizer.json"))),
  tokenizerConfig: JSON.parse(readFileSync(join(modelDir, "tokenizer_config.json"))),
});
const texts = JSON.parse(readFileSync(textsPath));
writeFileSync(idsPath, JSON.stringify(texts.map((t) => tokenizer.encode(t, { add_special_tokens: false }))));
