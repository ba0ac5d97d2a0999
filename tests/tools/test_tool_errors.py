"""Every tools/ script fails in one line, never a traceback: --help without the optional modules,
a missing or malformed file, an output that is an input, a device or a FIFO, a missing module (forced
by a shim that makes its import fail). Standard library only (CI has neither torch nor h5py)."""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
SCRIPTS = ["plan_layout", "trace_gantt", "hf_answers", "make_goldens", "lfm2_text", "make_text_goldens",
           "make_prompt_goldens", "step_time_plot", "fp8_accuracy"]
BROKEN = ["h5py", "numpy", "torch", "transformers", "safetensors", "tokenizers", "matplotlib", "jinja2"]


class ToolErrors(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.shim = self.path("shim")
        os.mkdir(self.shim)
        for m in BROKEN:  # every optional module fails to import, whether installed here or not
            with open(os.path.join(self.shim, m + ".py"), "w") as f:
                f.write(f"raise ImportError(\"No module named '{m}' (test shim)\")\n")

    def tearDown(self):
        self.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def run_tool(self, script, *args, shim=True):
        env = dict(os.environ, PYTHONPATH=self.shim if shim else "")
        return subprocess.run([sys.executable, os.path.join(TOOLS, script + ".py"), *args], capture_output=True,
                              text=True, env=env, cwd=self.dir.name, timeout=60)

    def one_error(self, p, script, pattern):
        """Exit 1, one stderr line "<script>: error: ..." matching pattern, no traceback."""
        self.assertEqual(p.returncode, 1, (p.stdout, p.stderr))
        self.assertNotIn("Traceback", p.stderr)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertRegex(lines[0], f"^{script}: error: {pattern}")

    def test_help_needs_no_optional_module(self):
        for script in SCRIPTS:
            p = self.run_tool(script, "--help")
            self.assertEqual(p.returncode, 0, (script, p.stderr))
            self.assertIn("usage:", p.stdout, script)
            self.assertNotIn("Traceback", p.stderr, script)

    def test_missing_input_file(self):
        self.one_error(self.run_tool("plan_layout", "--config", "nope.json", "--sequences", "4", "--seq-len", "4",
                                     "--gpus", "1", "--memory-gib", "80"), "plan_layout", "--config nope.json: no such file")
        self.one_error(self.run_tool("trace_gantt", "nope.json", "x.png"), "trace_gantt", "trace nope.json: no such file")
        self.one_error(self.run_tool("hf_answers", "nope.h5", "i.h5", "a.h5"), "hf_answers", "model nope.h5: no such file")
        self.one_error(self.run_tool("fp8_accuracy", "nope.h5", "b.h5"), "fp8_accuracy", "reference nope.h5: no such file")
        self.one_error(self.run_tool("lfm2_text", "decode", "nope.h5", "o.h5", "r.jsonl"), "lfm2_text",
                       "model nope.h5: no such file")
        self.one_error(self.run_tool("lfm2_text", "encode", "nope.h5", "p.jsonl", "i.h5"), "lfm2_text",
                       "prompts p.jsonl: no such file")
        self.one_error(self.run_tool("plan_layout", "--config", "nope.json", "--sequences", "4", "--seq-len", "4",
                                     "--nvidia-smi", "nope.csv"), "plan_layout", "--config nope.json: no such file")

    def test_malformed_input_file(self):
        with open(self.path("bad.json"), "w") as f:
            f.write("{not json")
        self.one_error(self.run_tool("plan_layout", "--config", "bad.json", "--sequences", "4", "--seq-len", "4",
                                     "--gpus", "1", "--memory-gib", "80"), "plan_layout", "--config bad.json: not JSON")
        with open(self.path("cfg.json"), "w") as f:
            json.dump({"hidden_size": 64}, f)
        self.one_error(self.run_tool("plan_layout", "--config", "cfg.json", "--sequences", "4", "--seq-len", "4",
                                     "--gpus", "1", "--memory-gib", "80"), "plan_layout",
                       "cfg.json: the config lacks whole numbers for vocab_size")
        with open(self.path("smi.csv"), "w") as f:
            f.write("lots\n")
        with open(self.path("ok.json"), "w") as f:
            json.dump({"vocab_size": 64, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2}, f)
        self.one_error(self.run_tool("plan_layout", "--config", "ok.json", "--sequences", "4", "--seq-len", "4",
                                     "--nvidia-smi", "smi.csv"), "plan_layout", "the nvidia-smi output holds a line")
        self.one_error(self.run_tool("trace_gantt", "bad.json", "x.png"), "trace_gantt", "trace bad.json: not JSON")
        with open(self.path("t.json"), "w") as f:
            json.dump({"traceEvents": [{"ph": "X", "pid": 0, "name": "f", "ts": 1}]}, f)
        self.one_error(self.run_tool("trace_gantt", "t.json", "x.png"), "trace_gantt", "trace t.json: a malformed span")
        for width in ("0", "-5", "nan", "inf", "1e9"):
            self.one_error(self.run_tool("trace_gantt", "t.json", "x.png", "--width", width), "trace_gantt",
                           re.escape(f"--width {float(width):g}: not a width in inches in [1, 200]") + "$")
        self.one_error(self.run_tool("make_goldens", "--only", "nope"), "make_goldens", "--only: unknown case")
        self.one_error(self.run_tool("step_time_plot", "bad.json", "s.svg"), "step_time_plot",
                       "bad.json: no 'step B=32 C=... ms ... floor ... ms' lines")

    def test_special_files(self):
        os.mkfifo(self.path("fifo.json"))
        self.one_error(self.run_tool("trace_gantt", "fifo.json", "x.png"), "trace_gantt",
                       "trace fifo.json: is a FIFO, not a regular file")
        self.one_error(self.run_tool("plan_layout", "--config", "fifo.json", "--sequences", "4", "--seq-len", "4",
                                     "--gpus", "1", "--memory-gib", "80"), "plan_layout", "--config fifo.json: is a FIFO")
        with open(self.path("t.json"), "w") as f:
            json.dump({"traceEvents": [{"ph": "X", "pid": 0, "tid": 0, "name": "f", "ts": 1, "dur": 2}]}, f)
        self.one_error(self.run_tool("trace_gantt", "t.json", "/dev/null"), "trace_gantt",
                       "png /dev/null: is a character device, not a regular file")
        self.one_error(self.run_tool("trace_gantt", "t.json", "t.json"), "trace_gantt",
                       "png t.json: is also the input t.json; refusing to overwrite an input")
        self.one_error(self.run_tool("trace_gantt", "t.json", "fifo.json"), "trace_gantt", "png fifo.json: is a FIFO")
        os.symlink("nowhere.png", self.path("dangling.png"))
        self.one_error(self.run_tool("trace_gantt", "t.json", "dangling.png"), "trace_gantt",
                       "png dangling.png: is a symbolic link to a missing file")
        open(self.path("m.h5"), "w").close()
        self.one_error(self.run_tool("hf_answers", "m.h5", "m.h5", "/dev/null"), "hf_answers",
                       "answers /dev/null: is a character device")
        self.one_error(self.run_tool("hf_answers", "m.h5", "i.h5", "m.h5", "--make-inputs", "2x3"), "hf_answers",
                       "answers m.h5: is also the input m.h5")
        self.assertTrue(os.path.exists(self.path("fifo.json")) and not os.path.isfile(self.path("fifo.json")))
        self.assertEqual(os.listdir(self.dir.name).count("x.png"), 0)

    def test_missing_module_named_with_its_install(self):
        with open(self.path("t.json"), "w") as f:
            json.dump({"traceEvents": [{"ph": "X", "pid": 0, "tid": 0, "name": "f", "ts": 1, "dur": 2}]}, f)
        self.one_error(self.run_tool("trace_gantt", "t.json", "x.png"), "trace_gantt",
                       "needs the Python module 'matplotlib' .*pip install matplotlib")
        open(self.path("m.h5"), "w").close()
        self.one_error(self.run_tool("hf_answers", "m.h5", "m.h5", "a.h5"), "hf_answers",
                       "needs the Python module 'h5py' .*pip install h5py")
        self.one_error(self.run_tool("make_goldens", "--only", "tied_gqa2_top2", "--out", "."), "make_goldens",
                       "needs the Python module 'h5py'")
        self.one_error(self.run_tool("plan_layout", "--model", "m.h5", "--sequences", "4", "--seq-len", "4",
                                     "--gpus", "1", "--memory-gib", "80"), "plan_layout", "needs the Python module 'h5py'")
        with open(self.path("p.txt"), "w") as f:
            f.write("hello\n")
        open(self.path("m.h5"), "w").close()
        with open(self.path("p.jsonl"), "w") as f:
            f.write('{"prompt": "hello"}\n')
        self.one_error(self.run_tool("lfm2_text", "encode", "m.h5", "p.jsonl", "i.h5"), "lfm2_text",
                       "needs the Python module 'h5py'")
        self.one_error(self.run_tool("make_text_goldens", "--out", "."), "make_text_goldens",
                       "needs the Python module 'transformers'")
        self.one_error(self.run_tool("make_prompt_goldens", "h5pack", "--out", "."), "make_prompt_goldens",
                       "needs the Python module 'torch'")
        with open(self.path("steps.log"), "w") as f:
            f.write("step B=32   C=1024      6.893 ms (mean 6.896)   4642 tok/s  floor 5.605 ms (weights)\n")
        self.one_error(self.run_tool("step_time_plot", "steps.log", "s.svg"), "step_time_plot",
                       "needs the Python module 'matplotlib'")
        self.one_error(self.run_tool("step_time_plot", "steps.log", "steps.log"), "step_time_plot",
                       "plot steps.log: name it .svg, .png or .pdf")
        self.assertFalse(os.path.exists(self.path("x.png")))
        self.assertFalse(os.path.exists(self.path("s.svg")))


if __name__ == "__main__":
    unittest.main()
