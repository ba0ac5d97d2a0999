#!/usr/bin/env python3
"""Goldens for lfm2-rank's text path end to end (--prompts / --results, docs/text.md): what Hugging
Face transformers answers to tests/text/chat.jsonl with the same weights and the same template.

    python3 tools/make_prompt_goldens.py H5PACK [--out tests/text] [--seed 2]

Synthesizes the test model as the ctest `prompts_end_to_end` does (`h5pack synth --preset lfm2-tiny
--dtype fp32 --seed SEED --text tests/text/tokenizer`), loads it into transformers'
Lfm2MoeForCausalLM (tools/hf_answers.py's loader, fp32, eager), renders each request with
AutoTokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=True) and runs
`generate` greedily (do_sample=False) with the request's max_tokens (else the run's default: the
model's positions allow it, so 256) and the model's eos_token_id, then `decode(new ids,
skip_special_tokens=True)`. Writes OUT/prompt_goldens.json: per request its id, prompt ids,
token_ids, text, finish_reason ("stop" at an EOS, or at a stop string: generate(stop_strings=...)
stops on the token that completes it, and the text is cut before it), and the smallest top-1 /
top-2 logit gap over its steps (a run whose gap is tiny could differ by one ulp: pick a seed whose
gaps are not). Needs torch and transformers (tools/requirements.txt); the output is small and
committed, so the test needs neither.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from tool_cli import ToolError, need, run

TOOL = "make_prompt_goldens"
DEFAULT_NEW_TOKENS = 256  # lfm2-rank's --prompts default (the test model has no max_new_tokens)


def golden(model, tok, req, eos, torch):
    ids = tok.apply_chat_template(req["messages"], tools=req.get("tools"), add_generation_prompt=True,
                                  tokenize=True, return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    k = req.get("max_tokens", DEFAULT_NEW_TOKENS)
    stops = req.get("stop", [])
    stops = [stops] if isinstance(stops, str) else stops
    extra = {"stop_strings": stops, "tokenizer": tok} if stops else {}
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=k, do_sample=False, eos_token_id=eos,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True, **extra)
    new = [int(t) for t in out.sequences[0, len(ids):]]
    gaps = [float((s[0].topk(2).values[0] - s[0].topk(2).values[1])) for s in out.scores]
    text = tok.decode(new, skip_special_tokens=True)
    # generate stops on the token that completes a stop string; the answer's text ends before it
    # (the OpenAI / vLLM rule, docs/text.md).
    cuts = [text.find(st) for st in stops if st in text]
    reason = "stop" if cuts or (new and new[-1] in eos) else "length"
    if cuts:
        text = text[:min(cuts)]
    return {"id": req["id"], "prompt_ids": list(map(int, ids)), "token_ids": new, "text": text,
            "finish_reason": reason, "min_gap": min(gaps)}


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("h5pack")
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "text"))
    ap.add_argument("--seed", type=int, default=2)
    args = ap.parse_args(argv)
    torch, transformers = need(TOOL, "torch"), need(TOOL, "transformers")
    import hf_answers
    hf_answers.import_deps()
    tok_dir = os.path.join(args.out, "tokenizer")
    with open(os.path.join(tok_dir, "generation_config.json")) as f:
        eos = json.load(f)["eos_token_id"]
    eos = eos if isinstance(eos, list) else [eos]
    with open(os.path.join(args.out, "chat.jsonl"), encoding="utf-8") as f:
        requests = [json.loads(line) for line in f if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        m = os.path.join(tmp, "m.h5")
        subprocess.run([args.h5pack, "-q", "synth", m, "--preset", "lfm2-tiny", "--dtype", "fp32", "--seed",
                        str(args.seed), "--text", tok_dir], check=True)
        model, _ = hf_answers.load_model(m)
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    results = [golden(model, tok, r, eos, torch) for r in requests]
    out = {"versions": {"transformers": transformers.__version__, "torch": torch.__version__},
           "model": {"preset": "lfm2-tiny", "dtype": "fp32", "seed": args.seed}, "eos": eos, "results": results}
    path = os.path.join(args.out, "prompt_goldens.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    gaps = ", ".join(f"{r['id']} {r['min_gap']:.3g}" for r in results)
    print(f"{TOOL}: wrote {path}: {len(results)} answers (smallest logit gaps: {gaps})")
    return 0


if __name__ == "__main__":
    sys.exit(run(TOOL, main, sys.argv[1:]))
