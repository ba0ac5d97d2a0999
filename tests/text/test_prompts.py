#!/usr/bin/env python3
"""Text in, text out, end to end (issue 22's Done-when): a checkpoint directory with a tokenizer,
a JSONL of chat messages, and

    launch/local.sh -n 2 --model m.h5 --prompts chat.jsonl --results out.jsonl

run from the test's own directory give the answers that Hugging Face transformers' `generate` +
`decode` give on the same weights and template (tests/text/prompt_goldens.json, written by
tools/make_prompt_goldens.py: greedy, fp32). Then the same through --stream and
`tools/lfm2_text.py stream`, and --eos none.

    python3 tests/text/test_prompts.py LFM2_RANK H5PACK

Needs tokenizers, jinja2, h5py and numpy (the front end's; scripts/setup.sh installs them) and
mpirun: exit 77 (skipped) without them, except under CI (CI=true), where it fails."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
try:
    import h5py
    import jinja2  # noqa: F401
    import numpy  # noqa: F401
    import tokenizers  # noqa: F401
except ImportError as e:
    if os.environ.get("CI") == "true":
        sys.exit(f"tests/text: {e}: scripts/setup.sh installs tokenizers, jinja2, h5py and numpy (CI must run this)")
    print(f"tests/text: {e}: skipped")
    sys.exit(77)

RANK, H5PACK = sys.argv.pop(1), sys.argv.pop(1)
GOLDENS = json.load(open(os.path.join(HERE, "prompt_goldens.json"), encoding="utf-8"))
ENV = dict(os.environ, LFM2_RANK=os.path.abspath(RANK), OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none")


def lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class PromptsEndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="lfm2-prompts-")
        ckpt = os.path.join(cls.dir, "ckpt")
        shutil.copytree(os.path.join(HERE, "tokenizer"), ckpt)
        m = GOLDENS["model"]
        subprocess.run([os.path.abspath(H5PACK), "-q", "synth", "m.h5", "--preset", m["preset"], "--dtype", m["dtype"],
                        "--seed", str(m["seed"]), "--text", "ckpt"], cwd=cls.dir, check=True)
        shutil.copy(os.path.join(HERE, "chat.jsonl"), cls.dir)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def local(self, *args):
        cmd = [os.path.join(ROOT, "launch", "local.sh"), "-n", "2", "--model", "m.h5", "--prompts", "chat.jsonl",
               *args]
        return subprocess.run(cmd, cwd=self.dir, env=ENV, capture_output=True, text=True, timeout=300)

    def test_answers_equal_transformers(self):
        r = self.local("--results", "out.jsonl")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("generation: up to 256 new tokens a sequence (the default of --prompts", r.stdout)
        self.assertIn("EOS 7, 2 (the model's generation_config.json)", r.stdout)
        got = lines(os.path.join(self.dir, "out.jsonl"))
        want = GOLDENS["results"]
        self.assertEqual([g["id"] for g in got], [w["id"] for w in want])
        for g, w in zip(got, want):
            with self.subTest(id=w["id"]):
                self.assertEqual(g["token_ids"], w["token_ids"])
                self.assertEqual(g["text"], w["text"])
                self.assertEqual(g["finish_reason"], w["finish_reason"])
                self.assertEqual(g["usage"], {"prompt_tokens": len(w["prompt_ids"]),
                                              "completion_tokens": len(w["token_ids"])})
        self.assertIn("stop", [g["finish_reason"] for g in got])
        with h5py.File(os.path.join(self.dir, "out.inputs.h5"), "r") as f:  # the prompts, token for token
            for i, w in enumerate(want):
                self.assertEqual(list(f["input_ids"][i, :f["lengths"][i]]), w["prompt_ids"])
        with h5py.File(os.path.join(self.dir, "out.outputs.h5"), "r") as f:
            self.assertEqual(json.loads(f.attrs["eos"]), GOLDENS["eos"])

    def test_stream_gives_the_same_text(self):
        r = self.local("--results", "s.jsonl", "--stream", "--quiet")
        self.assertEqual(r.returncode, 0, r.stderr)
        events = [json.loads(line) for line in r.stdout.splitlines()]  # stdout: the events alone
        self.assertTrue(all(set(e) in ({"seq", "token"}, {"seq", "done"}) for e in events), events[:3])
        self.assertEqual(sum(1 for e in events if e.get("done")), len(GOLDENS["results"]))
        s = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "lfm2_text.py"), "stream", "m.h5", "-",
                            "--inputs", "s.inputs.h5"], cwd=self.dir, input=r.stdout, capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(s.returncode, 0, s.stderr)
        texts, reasons = {}, {}
        for piece in map(json.loads, s.stdout.splitlines()):
            texts[piece["id"]] = texts.get(piece["id"], "") + piece["text"]
            if "finish_reason" in piece:
                reasons[piece["id"]] = piece["finish_reason"]
        for w in GOLDENS["results"]:
            self.assertEqual(texts.get(w["id"], ""), w["text"], w["id"])
            self.assertEqual(reasons.get(w["id"]), w["finish_reason"], w["id"])

    def test_eos_none(self):
        r = self.local("--results", "n.jsonl", "--eos", "none", "--max-new-tokens", "4")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("no EOS (--eos none)", r.stdout)
        with h5py.File(os.path.join(self.dir, "n.outputs.h5"), "r") as f:
            self.assertEqual(json.loads(f.attrs["eos"]), [])


if __name__ == "__main__":
    if not shutil.which("mpirun"):
        sys.exit(1 if os.environ.get("CI") == "true" else 77)
    unittest.main()
