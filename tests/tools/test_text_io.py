"""tools/text_io.py with a word-level tokenizer built here: prompts -> inputs (ids, lengths) ->
generated tokens -> text. Exits 77 (skipped) without tokenizers, h5py or numpy."""
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "text_io.py")
VOCAB = {w: i for i, w in enumerate(["<pad>", "<s>", "the", "cat", "sat", "on", "mat", "a", "dog", "[UNK]"])}


def run(*args, ok=True):
    p = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)
    assert (p.returncode == 0) == ok, (args, p.returncode, p.stdout, p.stderr)
    return p


with tempfile.TemporaryDirectory() as d:
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok_path = os.path.join(d, "tokenizer.json")
    tok.save(tok_path)
    prompts = os.path.join(d, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("the cat sat on the mat\n\na dog\nthe zebra\n")
    inputs = os.path.join(d, "in.h5")
    run("encode", tok_path, prompts, inputs, "--bos", "1")
    with h5py.File(inputs) as f:
        ids, lengths = f["input_ids"][:], f["lengths"][:]
    assert lengths.tolist() == [7, 3, 3], lengths
    assert ids[0].tolist() == [1, 2, 3, 4, 5, 2, 6], ids[0]
    assert ids[1].tolist() == [1, 7, 8, 0, 0, 0, 0], ids[1]
    assert ids[2].tolist()[:3] == [1, 2, VOCAB["[UNK]"]], ids[2]
    outputs = os.path.join(d, "out.h5")
    with h5py.File(outputs, "w") as f:
        f["generated"] = np.array([[3, 4, 0], [8, 4, 5]], dtype=np.int32)
        f["n_generated"] = np.array([2, 3], dtype=np.int32)
    text = run("decode", tok_path, outputs).stdout.splitlines()
    assert text == ["0\tcat sat", "1\tdog sat on"], text
    assert "no generated tokens" in run("decode", tok_path, inputs, ok=False).stderr
    assert "text_io: error" in run("encode", os.path.join(d, "missing.json"), prompts, inputs, ok=False).stderr
print("text_io: encode and decode round trip")
