#!/usr/bin/env python3
"""Text in and out of lfm2-rank with the tokenizer and chat template the model file carries.

    python3 tools/lfm2_text.py encode MODEL.h5 PROMPTS.jsonl INPUTS.h5
    python3 tools/lfm2_text.py decode MODEL.h5 OUTPUTS.h5 RESULTS.jsonl [--inputs INPUTS.h5] [--eos ID]...
    python3 tools/lfm2_text.py stream MODEL.h5 [EVENTS.jsonl] [--inputs INPUTS.h5] [--eos ID]...

encode: one request a line ({"prompt": ...}, {"messages": [...]} or {"input_ids": [...]}, with
optional id, max_tokens, temperature, top_p, top_k, seed, stop, tools) -> the inputs file of
lfm2-rank (input_ids, lengths, the per-request parameters, request ids and stop strings).
decode: lfm2-rank's outputs -> one JSON line per request, in input order: id, text, token_ids,
finish_reason ("stop" at an EOS or a stop string, "length" otherwise), usage.
stream: token events, one JSON line each ({"seq": 0, "token": 17}; {"seq": 0, "done": true} ends
a sequence; the end of the input ends all), from a file or standard input -> text as it becomes
final, one JSON line per piece ({"id", "index", "text"}, and "finish_reason" on a sequence's last).
Tokens as transformers makes them (docs/text.md); exit 0 done, 1 a bad input (one line naming the
file, line and field; no output left behind).
"""
import argparse
import json
import sys

from tool_cli import ToolError, atomic_output, check_input, need, output_target, run

TOOL = "lfm2_text"


def _encode_messages(model, r, where, templates):
    """A chat request's ids: the template rendered as transformers renders it, then encoded
    without special tokens added (the template writes them)."""
    from lfm2text import chat_template
    jinja2 = need(TOOL, "jinja2")
    source = model.chat_template(tools=r.tools)
    if source is None:
        raise ToolError(f"{where}: messages need a chat template, and model {model.path} has none "
                        f"(give prompt or input_ids)")
    if source not in templates:
        try:
            templates[source] = chat_template.compile_template(source)
        except jinja2.TemplateSyntaxError as e:
            raise ToolError(f"model {model.path}: the chat template does not compile: line {e.lineno}: "
                            f"{e.message}") from None
    try:
        text = chat_template.render(templates[source], r.source, r.tools, model.special_tokens())
    except chat_template.TemplateRefused as e:
        raise ToolError(f"{where}: the chat template refused the messages: {e}") from None
    except Exception as e:  # jinja2's errors and what a template's expressions raise
        raise ToolError(f"{where}: chat template error: {type(e).__name__}: {e}") from None
    return model.tokenizer().encode(text, add_special_tokens=False).ids


def _encode_one(model, r, where, templates):
    if r.kind == "input_ids":
        ids, what = r.source, "input_ids"
    elif r.kind == "prompt":
        ids, what = model.tokenizer().encode(r.source, add_special_tokens=True).ids, "the encoded prompt"
    else:
        ids, what = _encode_messages(model, r, where, templates), "the encoded messages"
    if not ids:
        raise ToolError(f"{where}: the prompt encodes to no tokens")
    for j, t in enumerate(ids):
        if not 0 <= t < model.vocab_size:
            raise ToolError(f"{where}: {what}[{j}] = {t} is outside the model's vocabulary [0, {model.vocab_size})")
    limit = model.max_positions
    if limit and len(ids) + r.params.get("max_tokens", 0) > limit:
        extra = f" plus max_tokens {r.params['max_tokens']}" if "max_tokens" in r.params else ""
        raise ToolError(f"{where}: {len(ids)} prompt tokens{extra} exceed the model's max_position_embeddings {limit}")
    return ids


def encode(model_path, prompts_path, out_path):
    from lfm2text.model_text import ModelText
    from lfm2text.requests import read_requests
    from lfm2text.token_files import write_inputs
    check_input(prompts_path, "prompts")
    output_target(out_path, "inputs", [model_path, prompts_path])
    model = ModelText(model_path)
    requests = read_requests(prompts_path)
    if any(r.kind != "input_ids" for r in requests):
        model.tokenizer()
        note = model.tokenizer_class_note()
        if note:
            print(f"{TOOL}: warning: {note}", file=sys.stderr)
    templates = {}
    rows = [_encode_one(model, r, f"{prompts_path} line {r.line}", templates) for r in requests]
    n, width = write_inputs(out_path, rows, requests, model, [model_path, prompts_path])
    print(f"{TOOL}: wrote {out_path}: {n} requests, prompts of {min(map(len, rows))} to {width} tokens")


def _request_info(inputs_path, outputs_path):
    """The requests' ids, lengths and stop strings: --inputs, else the outputs file itself when it
    carries them, else the inputs file the run names (its `inputs` attribute), found from here or
    beside the outputs."""
    import os
    from lfm2text.token_files import RequestInfo
    if inputs_path:
        return RequestInfo(inputs_path)
    h5py = need(TOOL, "h5py")
    with h5py.File(outputs_path, "r") as f:
        if "request_id" in f:
            return RequestInfo(outputs_path)
        named = str(f.attrs.get("inputs", ""))
    for candidate in (named, os.path.join(os.path.dirname(outputs_path), os.path.basename(named))):
        if named and os.path.isfile(candidate):
            with h5py.File(candidate, "r") as f:
                if "request_id" in f:
                    return RequestInfo(candidate)
    raise ToolError(f"outputs {outputs_path}: has no request ids, nor does the inputs file it names "
                    f"({named or 'none'}); give --inputs INPUTS.h5 (the file encode wrote)")


def _check_ids(row, vocab, where):
    for j, t in enumerate(row):
        if not 0 <= t < vocab:
            raise ToolError(f"{where}, token {j}: id {t} is outside the tokenizer's vocabulary [0, {vocab})")


def decode(model_path, outputs_path, results_path, inputs_path, eos, no_eos=False):
    from lfm2text.detok import complete
    from lfm2text.model_text import ModelText
    from lfm2text.token_files import read_outputs
    output_target(results_path, "results", [model_path, outputs_path, inputs_path])
    model = ModelText(model_path)
    tok = model.tokenizer()
    rows, run_eos = read_outputs(outputs_path)
    info = _request_info(inputs_path, outputs_path)
    if len(rows) != len(info.ids):
        raise ToolError(f"outputs {outputs_path}: {len(rows)} sequences, but inputs {info.path} has {len(info.ids)} "
                        f"requests")
    if info.text_fingerprint and model.text_fingerprint and info.text_fingerprint != model.text_fingerprint:
        raise ToolError(f"inputs {info.path}: encoded with another tokenizer (text fingerprint "
                        f"{info.text_fingerprint}) than model {model_path}'s ({model.text_fingerprint})")
    eos = [] if no_eos else eos or (run_eos if run_eos is not None else model.eos_ids())
    vocab, clean = min(model.tokenizer_vocab(), model.vocab_size), model.cleans_up_spaces()
    lines = []
    for i, row in enumerate(rows):
        _check_ids(row, vocab, f"outputs {outputs_path}: sequence {i} (id '{info.ids[i]}')")
        text, ids, reason = complete(tok, row, eos, info.stops[i], info.max_tokens[i], clean)
        lines.append({"id": info.ids[i], "text": text, "token_ids": ids, "finish_reason": reason,
                      "usage": {"prompt_tokens": info.lengths[i], "completion_tokens": len(ids)}})
    with atomic_output(results_path, "results", [model_path, outputs_path, inputs_path]) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for obj in lines:
                f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    stopped = sum(r["finish_reason"] == "stop" for r in lines)
    print(f"{TOOL}: wrote {results_path}: {len(lines)} results ({stopped} stopped, {len(lines) - stopped} at length)")


def _event(line, where):
    try:
        ev = json.loads(line)
    except json.JSONDecodeError as e:
        raise ToolError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
    seq = ev.get("seq") if isinstance(ev, dict) else None
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise ToolError(f"{where}: an event is {{\"seq\": N, \"token\": ID}} or {{\"seq\": N, \"done\": true}}")
    if ev.get("done") is True:
        return seq, None
    token = ev.get("token")
    if not isinstance(token, int) or isinstance(token, bool):
        raise ToolError(f"{where}: event of sequence {seq} has no token id")
    return seq, token


def stream(model_path, events_path, inputs_path, eos, out=sys.stdout, no_eos=False):
    from lfm2text.detok import Completion
    from lfm2text.model_text import ModelText
    from lfm2text.token_files import RequestInfo
    model = ModelText(model_path)
    tok = model.tokenizer()
    info = RequestInfo(inputs_path) if inputs_path else None
    eos = [] if no_eos else eos or model.eos_ids()
    vocab, clean = min(model.tokenizer_vocab(), model.vocab_size), model.cleans_up_spaces()
    seqs = {}

    def say(seq, piece, c):
        obj = {"id": info.ids[seq] if info else str(seq), "index": seq, "text": piece}
        if c.finish_reason:
            obj["finish_reason"] = c.finish_reason
        out.write(json.dumps(obj, ensure_ascii=False) + "\n")
        out.flush()

    src = sys.stdin if events_path in (None, "-") else open(check_input(events_path, "events"), encoding="utf-8")
    with src:
        for line_no, line in enumerate(src, 1):
            if not line.strip():
                continue
            where = f"{'stdin' if events_path in (None, '-') else events_path} line {line_no}"
            seq, token = _event(line, where)
            if info and seq >= len(info.ids):
                raise ToolError(f"{where}: sequence {seq}, but inputs {info.path} has {len(info.ids)} requests")
            if seq not in seqs:
                seqs[seq] = Completion(tok, eos, info.stops[seq] if info else (),
                                       info.max_tokens[seq] if info else None, clean)
            c = seqs[seq]
            if c.finish_reason:
                continue
            if token is None:
                piece = c.finish("length")
            else:
                _check_ids([token], vocab, f"{where}: sequence {seq}")
                piece = c.push(token)
            if piece or c.finish_reason:
                say(seq, piece, c)
    for seq, c in seqs.items():
        if not c.finish_reason:
            say(seq, c.finish("length"), c)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="See docs/text.md.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("encode", help="prompts (JSONL) -> inputs file")
    e.add_argument("model")
    e.add_argument("prompts")
    e.add_argument("inputs")
    d = sub.add_parser("decode", help="outputs file -> results (JSONL)")
    d.add_argument("model")
    d.add_argument("outputs")
    d.add_argument("results")
    s = sub.add_parser("stream", help="token events (JSONL) -> text events (JSONL)")
    s.add_argument("model")
    s.add_argument("events", nargs="?", default="-")
    for p in (d, s):
        p.add_argument("--inputs", default=None, help="the inputs file encode wrote (request ids, stop strings)")
        p.add_argument("--eos", type=int, action="append", default=[],
                       help="end-of-sequence id (repeatable; default: the run's, else the model's)")
        p.add_argument("--no-eos", action="store_true", help="stop at no EOS id (the run had --eos none)")
    args = ap.parse_args(argv)
    if args.cmd == "encode":
        encode(args.model, args.prompts, args.inputs)
    elif args.cmd == "decode":
        decode(args.model, args.outputs, args.results, args.inputs, args.eos, args.no_eos)
    else:
        stream(args.model, args.events, args.inputs, args.eos, no_eos=args.no_eos)
    return 0


if __name__ == "__main__":
    sys.exit(run(TOOL, main, sys.argv[1:]))
