"""tools/plan_layout.py: the R x P it proposes for LFM2-8B-A1B on fake machines (saved nvidia-smi
output, or --gpus/--memory-gib), the weights it counts, the cache that forces stages, no fit, and
--model from an HDF5 file (that case only where h5py is installed). Standard library only."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "plan_layout.py")
ATTENTION = {2, 6, 10, 14, 18, 21}
CONFIG = {  # LFM2-8B-A1B (SPEC §1)
    "vocab_size": 65536, "hidden_size": 2048, "intermediate_size": 7168, "moe_intermediate_size": 1792,
    "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 8, "num_dense_layers": 2,
    "num_experts": 32, "num_experts_per_tok": 4, "conv_L_cache": 3, "tie_word_embeddings": True,
    "layer_types": ["full_attention" if i in ATTENTION else "conv" for i in range(24)],
}
H200, H100 = "143771\n", "81559\n"  # nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits (MiB)


class PlanLayout(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.config = self.path("config.json")
        with open(self.config, "w") as f:
            json.dump(CONFIG, f)

    def tearDown(self):
        self.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def smi(self, text):
        p = self.path("smi.txt")
        with open(p, "w") as f:
            f.write(text)
        return ["--nvidia-smi", p]

    def run_tool(self, *args, rc=0, model=None):
        src = ["--model", model] if model else ["--config", self.config]
        p = subprocess.run([sys.executable, TOOL, *src, *args, "--json"], capture_output=True, text=True)
        self.assertEqual(p.returncode, rc, p.stdout + p.stderr)
        return json.loads(p.stdout), p.stderr

    def proposal(self, *args):
        out, _ = self.run_tool(*args)
        return out["proposal"]["replicas"], out["proposal"]["stages"]

    def test_two_h200_take_one_model_each(self):
        # The 2-GPU case: 16.7 GB of bf16 weights fit one H200 twice over.
        out, _ = self.run_tool(*self.smi(2 * H200), "--sequences", "1024", "--seq-len", "32")
        self.assertEqual(out["gpus"], 2)
        self.assertEqual((out["proposal"]["replicas"], out["proposal"]["stages"]), (2, 1))
        self.assertEqual([(r["replicas"], r["stages"]) for r in out["layouts"]], [(2, 1), (1, 2)])
        # 8.34 B parameters: the whole model's weights are 16.7 GB in bf16 (vectors in fp32).
        self.assertAlmostEqual(out["layouts"][0]["weights"] / 1e9, 16.68, places=1)
        # Half the layers and the embedding per stage at P = 2.
        self.assertLess(out["layouts"][1]["weights"], 0.6 * out["layouts"][0]["weights"])

    def test_small_gpus_need_stages(self):
        self.assertEqual(self.proposal("--gpus", "8", "--memory-gib", "16", "--sequences", "1024", "--seq-len", "32"),
                         (4, 2))
        # fp32 doubles the weights: two 24 GiB GPUs hold one copy between them.
        self.assertEqual(self.proposal("--gpus", "2", "--memory-gib", "24", "--sequences", "1024", "--seq-len", "32",
                                       "--dtype", "fp32"), (1, 2))

    def test_the_generation_cache_forces_stages(self):
        args = ["--gpus", "4", "--memory-gib", "80", "--seq-len", "8192", "--new-tokens", "2048"]
        self.assertEqual(self.proposal(*args, "--sequences", "256"), (4, 1))
        out, _ = self.run_tool(*args, "--sequences", "2048")
        # 512 sequences' KV cache per GPU at 4 x 1 does not fit; 2 x 2 halves the layers that
        # hold it; 1 x 4 puts all 2048 sequences' cache of two attention layers on one GPU.
        self.assertEqual([r["fits"] for r in out["layouts"]], [False, True, False])
        self.assertEqual((out["proposal"]["replicas"], out["proposal"]["stages"]), (2, 2))
        kv = 2 * 512 * (8192 + 2048 - 1) * 8 * 64 * 2 * 6  # k and v, bf16, six attention layers
        self.assertEqual(out["layouts"][0]["state"], kv + 512 * 2 * 2048 * 4 * 18)  # + the conv state

    def test_the_smallest_gpu_counts(self):
        out, _ = self.run_tool(*self.smi(H100 + H100 + "40960\n" + H100), "--sequences", "64", "--seq-len", "32")
        self.assertEqual(out["gpus"], 4)
        self.assertEqual(out["gpu_bytes"], 40960 << 20)

    def test_nothing_fits(self):
        out, err = self.run_tool("--gpus", "2", "--memory-gib", "10", "--sequences", "256", "--seq-len", "32", rc=1)
        self.assertIsNone(out["proposal"])
        self.assertIn("no layout fits", err)

    def test_model_file(self):
        try:
            import h5py
        except ImportError:
            self.skipTest("no h5py")
        model = self.path("model.h5")
        with h5py.File(model, "w") as f:
            f.attrs["config_json"] = json.dumps(CONFIG)
        out, _ = self.run_tool("--gpus", "2", "--memory-gib", "140", "--sequences", "1024", "--seq-len", "32",
                               model=model)
        self.assertEqual((out["proposal"]["replicas"], out["proposal"]["stages"]), (2, 1))


if __name__ == "__main__":
    unittest.main()
