"""tools/lfm2_text.py against transformers, token for token: the test tokenizer of tests/text/tokenizer
(LFM2's shape) goes into a weight file (h5pack synth --text), and the front end's ids, rendered
chats and decoded texts must equal tests/text/goldens.json (written by tools/make_text_goldens.py
with transformers). Then decode, stream and every bad input of the new paths.

    python3 tests/text/test_lfm2_text.py H5PACK

Needs tokenizers, jinja2, h5py and numpy (scripts/setup.sh installs them): without them it exits
77 (skipped), except under CI (CI=true), where it fails."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.join(HERE, "..", "..", "tools")
sys.path.insert(0, TOOLS)
try:
    import h5py
    import jinja2  # noqa: F401
    import numpy as np
    import tokenizers  # noqa: F401
except ImportError as e:
    if os.environ.get("CI") == "true":
        sys.exit(f"tests/text: {e}: scripts/setup.sh installs tokenizers, jinja2, h5py and numpy (CI must run this)")
    print(f"skipped: {e}")
    sys.exit(77)

from lfm2text import chat_template, detok  # noqa: E402
from lfm2text.model_text import ModelText  # noqa: E402

H5PACK = sys.argv.pop(1) if len(sys.argv) > 1 else os.environ.get("H5PACK", "h5pack")
GOLDENS = json.load(open(os.path.join(HERE, "goldens.json"), encoding="utf-8"))


def sh(*cmd, ok=True, cwd=None):
    p = subprocess.run(list(cmd), capture_output=True, text=True, cwd=cwd, timeout=120)
    if ok and p.returncode != 0:
        raise AssertionError(f"{cmd} failed ({p.returncode}): {p.stderr}")
    return p


def front(*args, ok=True, cwd=None, stdin=None):
    p = subprocess.run([sys.executable, os.path.join(TOOLS, "lfm2_text.py"), *args], capture_output=True, text=True,
                       cwd=cwd, timeout=120, input=stdin)
    if ok and p.returncode != 0:
        raise AssertionError(f"lfm2_text {args} failed ({p.returncode}): {p.stderr}")
    return p


def write_jsonl(path, objs):
    with open(path, "w", encoding="utf-8") as f:
        for o in objs:
            f.write(json.dumps(o, ensure_ascii=False) + "\n")


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def inputs_rows(path):
    with h5py.File(path, "r") as f:
        return [list(map(int, row[:n])) for row, n in zip(f["input_ids"][()], f["lengths"][()])]


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        cls.model = cls.path("m.h5")
        sh(H5PACK, "-q", "synth", cls.model, "--preset", "lfm2-tiny", "--dtype", "fp32", "--text",
           os.path.join(HERE, "tokenizer"))
        cls.text = ModelText(cls.model)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)


class EqualsTransformers(Base):
    """The goldens: transformers' tokenizer(), apply_chat_template() and decode()."""

    def test_prompts(self):
        write_jsonl(self.path("p.jsonl"), [{"prompt": g["prompt"]} for g in GOLDENS["prompts"]])
        front("encode", self.model, self.path("p.jsonl"), self.path("p.h5"))
        for g, row in zip(GOLDENS["prompts"], inputs_rows(self.path("p.h5"))):
            self.assertEqual(row, g["ids"], repr(g["prompt"]))

    def test_chats(self):
        write_jsonl(self.path("c.jsonl"), [{k: c[k] for k in ("messages", "tools") if c.get(k)} for c in GOLDENS["chats"]])
        front("encode", self.model, self.path("c.jsonl"), self.path("c.h5"))
        rows = inputs_rows(self.path("c.h5"))
        for c, row in zip(GOLDENS["chats"], rows):
            self.assertEqual(row, c["ids"], c["messages"])
        template = chat_template.compile_template(self.text.chat_template())
        for c in GOLDENS["chats"]:
            got = chat_template.render(template, c["messages"], c.get("tools"), self.text.special_tokens())
            self.assertEqual(got, c["text"])

    def test_the_environment_with_more_templates(self):
        tok = self.text.tokenizer()
        for c in GOLDENS["template_chats"]:
            t = chat_template.compile_template(GOLDENS["templates"][c["template"]])
            try:
                got = chat_template.render(t, c["messages"], c.get("tools"), self.text.special_tokens())
            except chat_template.TemplateRefused as e:
                self.assertEqual(f"TemplateError: {e}", c.get("error"))
                continue
            self.assertEqual(got, c["text"], (c["template"], c["messages"]))
            self.assertEqual(tok.encode(got, add_special_tokens=False).ids, c["ids"])

    def test_decodes_and_streaming_adds_up_to_them(self):
        tok = self.text.tokenizer()
        for g in GOLDENS["decodes"]:
            self.assertEqual(tok.decode(g["ids"], skip_special_tokens=True), g["text"], g["ids"])
            self.assertEqual(tok.decode(g["ids"], skip_special_tokens=False), g["text_with_special"], g["ids"])
            c = detok.Completion(tok)
            pieces = [c.push(t) for t in g["ids"]] + [c.finish()]
            self.assertEqual("".join(pieces), g["text"], g["ids"])
            self.assertTrue(all("\ufffd" not in p for p in pieces[:-2]) or "\ufffd" in g["text"], pieces)


class DecodeAndStream(Base):
    """encode -> (outputs as lfm2-rank writes them) -> decode and stream."""

    GEN = [[53, 82, 89, 89, 92, 25, 7, 9, 9],   # "Hello," ... then EOS 7 and what follows it
           [431, 82, 90, 212, 47, 82, 305, 95, 86],
           [96, 102, 431, 82, 90, 212, 47, 82, 305],
           [2, 53, 82, 89, 89, 92, 25, 234, 100]]

    def setUp(self):
        write_jsonl(self.path("r.jsonl"), [
            {"prompt": "Hello", "id": "a"},
            {"prompt": "Größe", "id": "b", "max_tokens": 4},
            {"messages": [{"role": "user", "content": "hi"}], "id": "c", "stop": [self.stop_string()]},
            {"input_ids": [1, 2, 3], "id": "d"}])
        front("encode", self.model, self.path("r.jsonl"), self.path("r.h5"))
        with h5py.File(self.path("o.h5"), "w") as f:
            f["generated"] = np.array(self.GEN, dtype=np.int32)
            f["n_generated"] = np.array([7, 9, 9, 1], dtype=np.int32)

    def stop_string(self):
        tok = ModelText(self.model).tokenizer()
        whole = tok.decode(self.GEN[2], skip_special_tokens=True)
        return whole[len(tok.decode(self.GEN[2][:4], skip_special_tokens=True)):][:2]

    def test_decode(self):
        front("decode", self.model, self.path("o.h5"), self.path("out.jsonl"), "--inputs", self.path("r.h5"))
        res = read_jsonl(self.path("out.jsonl"))
        tok = self.text.tokenizer()
        self.assertEqual([r["id"] for r in res], ["a", "b", "c", "d"])
        self.assertEqual(res[0]["token_ids"], self.GEN[0][:7])   # up to and with the EOS
        self.assertEqual(res[0]["text"], tok.decode(self.GEN[0][:6]))
        self.assertEqual(res[0]["finish_reason"], "stop")
        self.assertEqual(res[1]["token_ids"], self.GEN[1][:4])   # its max_tokens
        self.assertEqual(res[1]["finish_reason"], "length")
        self.assertEqual(res[2]["finish_reason"], "stop")         # the stop string
        self.assertTrue(tok.decode(self.GEN[2]).startswith(res[2]["text"] + self.stop_string()), res[2])
        self.assertLess(len(res[2]["token_ids"]), 9)
        self.assertEqual(res[3]["token_ids"], [2])               # eos 2 of generation_config
        self.assertEqual(res[3]["text"], "")
        with h5py.File(self.path("r.h5"), "r") as f:
            self.assertEqual([r["usage"]["prompt_tokens"] for r in res], list(map(int, f["lengths"][()])))
        self.assertEqual([r["usage"]["completion_tokens"] for r in res], [len(r["token_ids"]) for r in res])

    def test_stream_adds_up_to_decode(self):
        front("decode", self.model, self.path("o.h5"), self.path("out.jsonl"), "--inputs", self.path("r.h5"))
        want = read_jsonl(self.path("out.jsonl"))
        events = [json.dumps({"seq": i, "token": row[t]}) for t in range(9) for i, row in enumerate(self.GEN)]
        p = front("stream", self.model, "-", "--inputs", self.path("r.h5"), stdin="\n".join(events) + "\n")
        text, reasons = {}, {}
        for line in p.stdout.splitlines():
            ev = json.loads(line)
            text[ev["id"]] = text.get(ev["id"], "") + ev["text"]
            if "finish_reason" in ev:
                reasons[ev["id"]] = ev["finish_reason"]
        for r in want:
            self.assertEqual(text.get(r["id"], ""), r["text"], r["id"])
            self.assertEqual(reasons[r["id"]], r["finish_reason"], r["id"])


class BadInputs(Base):
    """Each: exit 1, one line naming the file and line or field, no output file left."""

    def one_error(self, args, pattern, stdin=None):
        p = front(*args, ok=False, stdin=stdin)
        self.assertEqual(p.returncode, 1, p.stderr)
        lines = [line for line in p.stderr.splitlines() if line.strip()]
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertRegex(lines[0], "^lfm2_text: error: (.* )?" + pattern)
        self.assertNotIn("Traceback", p.stderr)

    def encode_error(self, lines, pattern, model=None):
        prompts = self.path("bad.jsonl")
        with open(prompts, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        out = self.path("bad.h5")
        self.one_error(["encode", model or self.model, prompts, out], pattern)
        self.assertFalse(os.path.exists(out))
        self.assertEqual([n for n in os.listdir(self.dir) if ".tmp." in n], [])

    def test_requests(self):
        ok = '{"prompt": "fine"}'
        bad = self.path("bad.jsonl")
        self.encode_error([ok, '{"prompt": "x",}'], f"{bad} line 2: not JSON")
        self.encode_error([ok, "", '{"messages": [{"role": "robot", "content": "x"}]}'],
                          r"line 3: messages\[0\].role 'robot' is not a known role")
        self.encode_error(['{"prompt": "x", "top_p": 2}'], "line 1: top_p 2 is not a number in \\(0, 1\\]")
        self.encode_error(['{"prompt": "x", "max_tokens": 0}'], "line 1: max_tokens 0 is not a whole number")
        self.encode_error(['{"prompt": "x", "temperature": -1}'], "line 1: temperature -1 is not")
        self.encode_error(['{"prompt": "x", "seed": -5}'], "line 1: seed -5 is not")
        self.encode_error(['{"prompt": "x", "max_token": 5}'], "line 1: unknown field 'max_token'")
        self.encode_error(['{"prompt": "x", "input_ids": [1]}'], "line 1: needs exactly one of")
        self.encode_error(['{"prompt": "x", "stop": ["a", ""]}'], "line 1: stop is neither")
        self.encode_error(['{"messages": [{"role": "user"}]}'], r"line 1: messages\[0\] has no content")
        self.encode_error(['{"input_ids": [1, 600]}'],
                          r"line 1: input_ids\[1\] = 600 is outside the model's vocabulary \[0, 512\)")
        self.encode_error([ok, '{"prompt": "y", "id": "0"}'], "line 2: id '0' is also the id of line 1")
        self.encode_error(['{"prompt": "x", "max_tokens": 1073741824}'], "line 1: 2 prompt tokens plus max_tokens")
        self.encode_error([], f"{bad}: no requests")
        self.encode_error(['["a list"]'], "line 1: a request is a JSON object")

    def test_model_side(self):
        bare = self.path("bare.h5")
        sh(H5PACK, "-q", "synth", bare, "--preset", "lfm2-tiny")
        self.encode_error(['{"prompt": "x"}'], f"model {bare}: carries no tokenizer", model=bare)
        self.one_error(["encode", self.path("none.h5"), self.path("x.jsonl"), self.path("y.h5")],
                       "prompts .*x.jsonl: no such file")
        # A template that does not compile, and one whose expression fails, each from its own model.
        for name, template, pattern in (
                ("broken", "{% for m in messages %}{{ m.content }", "the chat template does not compile: line 1"),
                ("failing", "{{ messages[0].content.nope() }}", r"line 1: chat template error: UndefinedError")):
            d = self.path(name)
            os.mkdir(d)
            for f in ("tokenizer.json", "special_tokens_map.json", "generation_config.json"):
                with open(os.path.join(HERE, "tokenizer", f), "rb") as src, open(os.path.join(d, f), "wb") as dst:
                    dst.write(src.read())
            with open(os.path.join(d, "chat_template.jinja"), "w") as f:
                f.write(template)
            sh(H5PACK, "-q", "synth", self.path(name + ".h5"), "--preset", "lfm2-tiny", "--text", d)
            self.encode_error(['{"messages": [{"role": "user", "content": "x"}]}'], pattern,
                              model=self.path(name + ".h5"))

    def test_decode_and_stream(self):
        write_jsonl(self.path("r.jsonl"), [{"prompt": "a"}, {"prompt": "b"}])
        front("encode", self.model, self.path("r.jsonl"), self.path("r.h5"))
        with h5py.File(self.path("o.h5"), "w") as f:
            f["generated"] = np.array([[5, 6], [600, 7]], dtype=np.int32)
        res = self.path("res.jsonl")
        self.one_error(["decode", self.model, self.path("o.h5"), res, "--inputs", self.path("r.h5")],
                       r"outputs .*o.h5: sequence 1 \(id '1'\), token 0: id 600 is outside the tokenizer's vocabulary")
        self.assertFalse(os.path.exists(res))
        self.one_error(["decode", self.model, self.path("o.h5"), res], "outputs .*: has no request ids, nor does")
        with h5py.File(self.path("o.h5"), "a") as f:  # as lfm2-rank records it: the inputs file it read
            f.attrs["inputs"] = self.path("r.h5")
        self.one_error(["decode", self.model, self.path("o.h5"), res], "sequence 1 \\(id '1'\\), token 0: id 600")
        self.one_error(["decode", self.model, self.path("r.h5"), res, "--inputs", self.path("r.h5")],
                       "outputs .*r.h5: no generated tokens")
        self.one_error(["stream", self.model], "stdin line 2: event of sequence 0 has no token id",
                       stdin='{"seq": 0, "token": 5}\n{"seq": 0}\n')
        self.one_error(["stream", self.model], "stdin line 1: not JSON", stdin="{oops\n")


if __name__ == "__main__":
    unittest.main(verbosity=1)
