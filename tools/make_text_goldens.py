#!/usr/bin/env python3
"""Golden files for the text front end (tools/lfm2_text.py): a test tokenizer shaped like LFM2's,
and what Hugging Face transformers makes of prompts, chats and token ids with it.

    python3 tools/make_text_goldens.py [--out tests/text]

Writes OUT/tokenizer/ (a checkpoint's text side, as `h5pack convert` takes it):
  tokenizer.json           a byte-level BPE trained here with `tokenizers` on the text below
                           (LFM2's shape: its special tokens at ids 0-13, a split regex before
                           the byte-level step, <|startoftext|> prepended by the post-processor)
  tokenizer_config.json    bos/eos/pad tokens and a multi-line chat template shaped like LFM2's
                           (system prompt, tools as JSON, tool responses, generation prompt)
  special_tokens_map.json, generation_config.json (eos_token_id [7, 2])
and OUT/goldens.json: for each case, transformers' answer (AutoTokenizer.from_pretrained on that
directory): `tokenizer(prompt).input_ids`, `apply_chat_template(messages, tools=...,
add_generation_prompt=True)` (the rendered text and its ids; also with two more templates that use
trim_blocks/lstrip_blocks, loop controls, raise_exception, tojson's arguments and the generation
tag), and `decode(ids, skip_special_tokens=True / False)` of id lists that cut characters in
the middle of their bytes. Needs transformers, tokenizers and jinja2 (no torch); the output is
small and committed, so the tests need none of this.
"""
import argparse
import json
import os
import random
import sys

from tool_cli import ToolError, need, run

TOOL = "make_text_goldens"

SPECIAL = ["<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|fim_pre|>", "<|fim_mid|>", "<|fim_suf|>",
           "<|im_start|>", "<|im_end|>", "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>",
           "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>"]

# Contractions, letters with one leading non-letter, numbers in threes, punctuation runs with their
# newlines, newline runs, trailing whitespace, other whitespace (the GPT-4 / Llama-3 family's split).
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = """The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!
Liquid foundation models run on phones, laptops and cars; the mixture of experts routes each token.
def generate(prompt, max_tokens=32):\n    return model(prompt)[:max_tokens]  # 4 spaces, then more
Größe, naïve café, Ærøskøbing, Straße — ¿Qué tal? Ça va très bien. Ελληνικά και русский текст.
日本語のテキストと中文文本，还有한국어 문장. العربية من اليمين إلى اليسار. हिन्दी पाठ भी है।
Emoji: 😀 🎉 👩‍👩‍👧 🇫🇷 👍🏽 🧪 ✨ — and numbers 12345, 3.14159, 2026-11-23, $1,000.00 (100%).
Tabs\tand\t\tspaces   and\n\n\nnewlines\r\n  stay as they are.   Trailing spaces   \n"""

TEMPLATE = """{{- bos_token -}}
{%- set ns = namespace(system_prompt="") -%}
{%- if messages[0]["role"] == "system" -%}
    {%- set ns.system_prompt = messages[0]["content"] -%}
    {%- set messages = messages[1:] -%}
{%- endif -%}
{%- if tools -%}
    {%- set ns.system_prompt = ns.system_prompt + ("\\n" if ns.system_prompt else "") + "List of tools: <|tool_list_start|>[" -%}
    {%- for tool in tools -%}
        {%- if tool is not string -%}
            {%- set tool = tool | tojson -%}
        {%- endif -%}
        {%- set ns.system_prompt = ns.system_prompt + tool -%}
        {%- if not loop.last -%}
            {%- set ns.system_prompt = ns.system_prompt + ", " -%}
        {%- endif -%}
    {%- endfor -%}
    {%- set ns.system_prompt = ns.system_prompt + "]<|tool_list_end|>" -%}
{%- endif -%}
{%- if ns.system_prompt -%}
    {{- "<|im_start|>system\\n" + ns.system_prompt + "<|im_end|>\\n" -}}
{%- endif -%}
{%- for message in messages -%}
    {{- "<|im_start|>" + message["role"] + "\\n" -}}
    {%- set content = message["content"] -%}
    {%- if content is not string -%}
        {%- set content = content | tojson -%}
    {%- endif -%}
    {%- if message["role"] == "tool" -%}
        {%- set content = "<|tool_response_start|>" + content + "<|tool_response_end|>" -%}
    {%- endif -%}
    {{- content + "<|im_end|>\\n" -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- "<|im_start|>assistant\\n" -}}
{%- endif -%}
"""

# Two more templates for the environment itself: whitespace by trim_blocks / lstrip_blocks (no
# "-"), loop controls, raise_exception, dict(), tojson's keyword arguments, the generation tag.
EXTRA_TEMPLATES = {
    "plain": """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}
        {{ raise_exception('unknown role ' + message['role']) }}
    {% endif %}
    {% if loop.index > 5 %}{% break %}{% endif %}
<|im_start|>{{ message['role'] }}
{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}{% endgeneration %}
{% elif message['content'] is string %}{{ message['content'] }}
{% else %}{{ message['content'] | tojson(indent=2, sort_keys=True) }}
{% endif %}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}""",
    "dicts": """{%- set meta = dict(n=messages | length, eos=eos_token) -%}
{%- for m in messages -%}[{{ m.role | upper }}|{{ meta.n }}] {{ m.content | tojson(ensure_ascii=True) }}{{ meta.eos }}
{% endfor -%}
{%- if add_generation_prompt %}[ASSISTANT|{{ meta.n }}]{% endif -%}""",
}

PROMPTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "   leading spaces, trailing spaces   ",
    "Tabs\tand\t\tspaces   and\n\n\nnewlines\r\n",
    "Größe naïve café — ¿Qué tal? 日本語 中文 한국어 العربية हिन्दी",
    "Emoji: 😀🎉👩‍👩‍👧🇫🇷👍🏽 ✨ and a ZWJ family 👨‍👩‍👧‍👦",
    "def f(x):\n    return x ** 2  # indented code\n",
    "numbers 1234567 and 3.14159 and 2026-11-23",
    "literal special tokens <|im_start|>user\nhi<|im_end|> inside a prompt",
    "",
    "\n",
    "x" * 200,
]

TOOLS = [{"name": "get_weather", "description": "Weather at a place — «quoted» ünïcode",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]

CHATS = [
    {"messages": [{"role": "user", "content": "What is C. elegans?"}]},
    {"messages": [{"role": "system", "content": "You are a helpful assistant trained by Liquid AI."},
                  {"role": "user", "content": "Größe? 😀\n\n   indented\tline  "}]},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! 👋"},
                  {"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS},
    {"messages": [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "Look it up."},
                  {"role": "assistant", "content": "<|tool_call_start|>[get_weather(city=\"Paris\")]<|tool_call_end|>"},
                  {"role": "tool", "content": "{\"temperature\": 21}"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "a list of parts"}]},
                  {"role": "assistant", "content": "ok", "reasoning_content": "thinking…"},
                  {"role": "user", "content": "literal <|im_end|> and <|im_start|>assistant\n inside"}]},
    {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "   "},
                  {"role": "user", "content": "\n\n\n"}]},
    {"messages": [{"role": "user", "content": "日本語 العربية 🇯🇵", "name": None}]},
]


def train_tokenizer():
    tk = need(TOOL, "tokenizers")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence([
        tk.pre_tokenizers.Split(tk.Regex(SPLIT), behavior="isolated"),
        tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL, show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS] * 3, trainer=trainer)
    tok.post_processor = tk.processors.TemplateProcessing(
        single="<|startoftext|> $A", pair="<|startoftext|> $A <|startoftext|> $B",
        special_tokens=[("<|startoftext|>", SPECIAL.index("<|startoftext|>"))])
    for i, s in enumerate(SPECIAL):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def write_tokenizer_dir(out):
    os.makedirs(out, exist_ok=True)
    train_tokenizer().save(os.path.join(out, "tokenizer.json"))
    config = {"add_bos_token": True, "bos_token": "<|startoftext|>", "eos_token": "<|im_end|>",
              "pad_token": "<|pad|>", "clean_up_tokenization_spaces": False, "legacy": False,
              "model_max_length": 32768, "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE}
    specials = {"bos_token": "<|startoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|pad|>"}
    generation = {"bos_token_id": 1, "eos_token_id": [7, 2], "pad_token_id": 0}
    for name, obj in (("tokenizer_config.json", config), ("special_tokens_map.json", specials),
                      ("generation_config.json", generation)):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")


def decode_cases(tok, n_cases=24, seed=7):
    """Id lists as a model might emit them: random ids (byte tokens cut characters apart), special
    tokens among them, runs of a chat's own ids."""
    rng = random.Random(seed)
    vocab = tok.vocab_size + len(tok.added_tokens_decoder)
    chat_ids = tok.apply_chat_template(CHATS[1]["messages"], add_generation_prompt=True)["input_ids"]
    cases = [chat_ids, chat_ids[5:17], tok(PROMPTS[5])["input_ids"][3:], [7], [], [2, 7, 2]]
    for _ in range(n_cases - len(cases)):
        cases.append([rng.randrange(vocab) for _ in range(rng.randrange(1, 40))])
    return [{"ids": ids, "text": tok.decode(ids, skip_special_tokens=True),
             "text_with_special": tok.decode(ids, skip_special_tokens=False)} for ids in cases]


def chat_golden(tok, chat, template=None):
    kw = {"tools": chat.get("tools"), "add_generation_prompt": True, "chat_template": template}
    try:
        text = tok.apply_chat_template(chat["messages"], tokenize=False, **kw)
        ids = tok.apply_chat_template(chat["messages"], **kw)["input_ids"]
        return {"text": text, "ids": list(ids)}
    except Exception as e:  # a template that refuses: the error text is the golden
        return {"error": f"{type(e).__name__}: {e}"}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "text"))
    args = ap.parse_args(argv)
    transformers, jinja2, tokenizers = (need(TOOL, m) for m in ("transformers", "jinja2", "tokenizers"))
    tok_dir = os.path.join(args.out, "tokenizer")
    write_tokenizer_dir(tok_dir)
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    extra_chats = CHATS + [{"messages": [{"role": "robot", "content": "beep"}]},
                           {"messages": [{"role": "user", "content": str(i)} for i in range(8)]}]
    goldens = {
        "versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "jinja2": jinja2.__version__},
        "prompts": [{"prompt": p, "ids": tok(p)["input_ids"]} for p in PROMPTS],
        "chats": [dict(chat, **chat_golden(tok, chat)) for chat in CHATS],
        "templates": EXTRA_TEMPLATES,
        "template_chats": [dict(chat, template=name, **chat_golden(tok, chat, t))
                           for name, t in EXTRA_TEMPLATES.items() for chat in extra_chats],
        "decodes": decode_cases(tok),
    }
    with open(os.path.join(args.out, "goldens.json"), "w", encoding="utf-8") as f:
        json.dump(goldens, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{TOOL}: wrote {tok_dir} and goldens.json: {len(goldens['prompts'])} prompts, {len(goldens['chats'])} "
          f"chats, {len(goldens['template_chats'])} template cases, {len(goldens['decodes'])} decodes "
          f"(transformers {transformers.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(run(TOOL, main, sys.argv[1:]))
