"""tools/fp8_accuracy.py on logits whose figures are known: identical outputs (0 error, 100 %, KL 0),
one row's top-1 moved, a uniform shift (no KL), all_logits, and refusals (other shapes, no dataset).
Skips (exit 77) without h5py and numpy."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import h5py
    import numpy as np
except ImportError:
    print("skipped: needs h5py and numpy")
    sys.exit(77)

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "fp8_accuracy.py")


class Fp8Accuracy(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, **datasets):
        path = os.path.join(self.dir.name, name)
        with h5py.File(path, "w") as f:
            for k, v in datasets.items():
                f[k] = v
        return path

    def run_tool(self, *args):
        out = os.path.join(self.dir.name, "out.json")
        p = subprocess.run([sys.executable, TOOL, *args, "--json", out], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(out) as f:
            return json.load(f)

    def test_known_figures(self):
        rng = np.random.default_rng(0)
        ref = rng.standard_normal((6, 50)).astype(np.float32)
        a = self.write("a.h5", logits=ref)
        same = self.run_tool(a, self.write("b.h5", logits=ref.copy()))
        self.assertEqual((same["rel_logit_error_max"], same["top1_agreement"], same["kl_mean"]), (0.0, 1.0, 0.0))
        shifted = self.run_tool(a, self.write("c.h5", logits=ref + 3))  # softmax is shift-invariant
        self.assertAlmostEqual(shifted["kl_max"], 0.0, places=6)
        self.assertEqual(shifted["top1_agreement"], 1.0)
        moved = ref.copy()
        moved[2, (ref[2].argmax() + 1) % 50] = ref[2].max() + 1  # row 2's top-1 moves
        m = self.run_tool(a, self.write("d.h5", logits=moved))
        self.assertAlmostEqual(m["top1_agreement"], 5 / 6)
        self.assertGreater(m["kl_max"], 0.0)
        d = np.abs(moved[2] - ref[2]).max() / np.abs(ref[2]).max()
        self.assertAlmostEqual(m["rel_logit_error_max"], d, places=5)

    def test_all_logits_and_refusals(self):
        ref = np.random.default_rng(1).standard_normal((3, 4, 20)).astype(np.float32)
        a = self.write("a.h5", all_logits=ref, logits=ref[:, -1])
        r = self.run_tool(a, self.write("b.h5", all_logits=ref, logits=ref[:, -1]), "--all-logits")
        self.assertEqual(r["rows"], 12)
        p = subprocess.run([sys.executable, TOOL, a, self.write("c.h5", logits=ref[:2, -1])], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertRegex(p.stderr.strip(), r"^fp8_accuracy: error: 'logits' is \(3, 20\) in .* but \(2, 20\)")
        p = subprocess.run([sys.executable, TOOL, a, self.write("e.h5", next_token=np.zeros(3, np.int32))],
                           capture_output=True, text=True, timeout=60)
        self.assertRegex(p.stderr.strip(), r"^fp8_accuracy: error: fp8 output .*: no dataset 'logits'")


if __name__ == "__main__":
    unittest.main()
