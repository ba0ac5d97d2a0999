#!/usr/bin/env python3
"""Text in and out of lfm2-rank with a model's tokenizer.json (Hugging Face `tokenizers`).

    python3 tools/text_io.py encode TOKENIZER.json PROMPTS.txt INPUTS.h5 [--bos ID]
    python3 tools/text_io.py decode TOKENIZER.json OUTPUTS.h5

encode: one prompt per line of PROMPTS.txt (empty lines skipped) -> input_ids int32 (N, S),
right-padded with 0, and lengths int32 (N), the inputs file lfm2-rank reads (--bos prepends an id).
decode: prints each sequence's generated tokens (generated (N, K), up to n_generated) as text, one
line per sequence, "i<TAB>text". Exit codes: 0 done, 1 a file or tokenizer problem (one line).
"""
import argparse
import sys

from tool_cli import ToolError, atomic_output, check_input, need, output_target, run

TOOL = "text_io"


def encode(tok_path, prompts_path, out_path, bos):
    check_input(tok_path, "tokenizer")
    check_input(prompts_path, "prompts")
    output_target(out_path, "inputs", [tok_path, prompts_path])
    h5py, np = need(TOOL, "h5py"), need(TOOL, "numpy")
    tok = need(TOOL, "tokenizers").Tokenizer.from_file(tok_path)
    vocab = tok.get_vocab_size()
    with open(prompts_path, encoding="utf-8") as f:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        raise ToolError(f"{prompts_path}: no prompts")
    rows = []
    for i, p in enumerate(prompts):
        ids = ([bos] if bos is not None else []) + tok.encode(p, add_special_tokens=False).ids
        if not ids:
            raise ToolError(f"{prompts_path}: prompt {i} encodes to no tokens")
        if bos is not None and not 0 <= bos < vocab:
            raise ToolError(f"--bos {bos} is outside the tokenizer's vocabulary [0, {vocab})")
        rows.append(ids)
    S = max(len(r) for r in rows)
    ids = np.zeros((len(rows), S), dtype=np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    with atomic_output(out_path, "inputs", [tok_path, prompts_path]) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("input_ids", data=ids)
        f.create_dataset("lengths", data=np.array([len(r) for r in rows], dtype=np.int32))
    print(f"text_io: wrote {out_path}: {len(rows)} prompts of up to {S} tokens")


def decode(tok_path, outputs_path):
    check_input(tok_path, "tokenizer")
    check_input(outputs_path, "outputs")
    h5py = need(TOOL, "h5py")
    tok = need(TOOL, "tokenizers").Tokenizer.from_file(tok_path)
    vocab = tok.get_vocab_size()
    with h5py.File(outputs_path, "r") as f:
        if "generated" not in f:
            raise ToolError(f"{outputs_path}: no generated tokens (run lfm2-rank with --max-new-tokens)")
        gen = f["generated"][:]
        n = f["n_generated"][:] if "n_generated" in f else [gen.shape[1]] * gen.shape[0]
    for i, row in enumerate(gen):
        bad = [int(t) for t in row[:int(n[i])] if not 0 <= int(t) < vocab]
        if bad:  # the tokenizer would drop them silently
            raise ToolError(f"{outputs_path}: sequence {i} holds id {bad[0]}, outside the tokenizer's vocabulary [0, {vocab})")
        print(f"{i}\t{tok.decode([int(t) for t in row[:int(n[i])]], skip_special_tokens=False)}")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("encode")
    e.add_argument("tokenizer")
    e.add_argument("prompts")
    e.add_argument("inputs")
    e.add_argument("--bos", type=int, default=None)
    d = sub.add_parser("decode")
    d.add_argument("tokenizer")
    d.add_argument("outputs")
    args = ap.parse_args(argv)
    if args.cmd == "encode":
        encode(args.tokenizer, args.prompts, args.inputs, args.bos)
    else:
        decode(args.tokenizer, args.outputs)
    return 0


if __name__ == "__main__":
    sys.exit(run(TOOL, main, sys.argv[1:]))
