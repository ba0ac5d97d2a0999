#!/usr/bin/env python3
"""Answers for lfm2-rank from Hugging Face transformers, run on the same weights.

Reads OUR HDF5 weight file (h5pack's format, docs/weight-format.md) with h5py, builds Lfm2MoeConfig
from its `config_json` root attribute and a Lfm2MoeForCausalLM, loads every tensor (stacked experts
w1/w3 (E, Im, H) become transformers-5's fused experts.gate_up_proj (E, 2*Im, H) = cat(w1, w3, dim 1),
gate rows first; w2 (E, H, Im) is experts.down_proj; conv (H, L) becomes conv.conv.weight (H, 1, L)),
runs fp32 with eager attention and the eager expert loop, and writes an answers file:
next_token int32 (N) and the last position's logits float32 (N, V).

  python3 tools/hf_answers.py MODEL.h5 INPUTS.h5 ANSWERS.h5
  python3 tools/hf_answers.py MODEL.h5 INPUTS.h5 ANSWERS.h5 --make-inputs 16x32 --seed 7

With --make-inputs NxS it first writes INPUTS.h5 (input_ids int32 (N, S), uniform over the
vocabulary, numpy seed --seed), redrawing any sequence whose expert routing has a near-tie (the
k-th and (k+1)-th routing scores closer than --min-router-gap), since there a one-ulp difference
between implementations may pick another expert. bf16/fp16 weights are read as floats (HDF5 converts the custom
16-bit types); the model still runs in fp32. Dependencies: tools/requirements.txt.
"""
import argparse
import json
import os
import sys

from tool_cli import ToolError, atomic_output, check_input, need, open_h5, output_target, run as run_tool

TOOL = "hf_answers"
h5py = np = torch = None  # imported by import_deps() once the arguments are read: --help needs none of them


def import_deps():
    global h5py, np, torch
    h5py, np, torch = need(TOOL, "h5py"), need(TOOL, "numpy"), need(TOOL, "torch")
    need(TOOL, "transformers")


def hf_name(path):
    """Our dataset path -> the HF state-dict key (see src/io/weight_names.h)."""
    if path == "lm_head":
        return "lm_head.weight"
    key = "model." + path.replace("/", ".")
    return key if key.endswith("expert_bias") else key + ".weight"


def read_f32(ds):
    """A dataset as float32. 16-bit datasets are read as raw bits and widened with numpy: HDF5's
    generic conversion of custom float types runs at a few tens of MB/s, minutes for a full model."""
    ftype = ds.id.get_type()
    if ftype.get_size() != 2:
        return torch.from_numpy(np.ascontiguousarray(ds[()], dtype=np.float32))
    raw = np.empty(ds.shape, dtype=np.uint16)
    ds.id.read(h5py.h5s.ALL, h5py.h5s.ALL, raw, mtype=ftype)
    esize = ftype.get_fields()[2]
    if esize == 8:  # bf16: the top half of a float32
        return torch.from_numpy((raw.astype(np.uint32) << 16).view(np.float32))
    return torch.from_numpy(raw.view(np.float16).astype(np.float32))  # IEEE fp16


def load_model(path, device="cpu"):
    """Lfm2MoeForCausalLM with the weights of our HDF5 file, fp32, on `device`.

    The model is built without initialising (meta device) and each tensor is copied into place as it
    is read, so the peak memory is the model plus one tensor (the full LFM2-8B-A1B: about 33 GB)."""
    from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM
    from transformers.models.lfm2_moe import modeling_lfm2_moe

    with open_h5(TOOL, path, "model") as f:
        if f.attrs.get("format") != "lfm2-rank-weights":
            raise ToolError(f"model {path}: not an lfm2-rank weight file")
        if "stage" in f.attrs:
            raise ToolError(f"model {path}: a stage file; give the whole-model file")
        cfg = Lfm2MoeConfig(**json.loads(f.attrs["config_json"]), attn_implementation="eager",
                            experts_implementation="eager")
        with torch.device("meta"):
            model = Lfm2MoeForCausalLM(cfg)
        model = model.to_empty(device=device).to(torch.float32).eval()
        # Non-persistent buffers (RoPE inverse frequencies) are not in the file: rebuild them.
        with torch.device(device):
            model.model.pos_emb = modeling_lfm2_moe.Lfm2MoeRotaryEmbedding(cfg)
        want = dict(model.named_parameters())
        want.update(dict(model.named_buffers()))
        if cfg.tie_word_embeddings:
            want.pop("lm_head.weight", None)
        filled = set()

        def put(key, tensor, rows=None):
            if key not in want:
                raise ToolError(f"{path}: {key} is not a tensor of transformers' model")
            dst = want[key] if rows is None else want[key][:, rows]
            if tuple(dst.shape) != tuple(tensor.shape):
                raise ToolError(f"{path}: {key} has shape {tuple(tensor.shape)}, transformers wants "
                                f"{tuple(dst.shape)}")
            with torch.no_grad():
                dst.copy_(tensor)
            filled.add(key)

        datasets = []
        f.visititems(lambda name, obj: datasets.append(name) if isinstance(obj, h5py.Dataset) else None)
        for name in datasets:
            if name.startswith("text/"):
                continue  # the text side (tokenizer, template, generation_config): not tensors
            t = read_f32(f[name])
            if "/feed_forward/experts/" in name:
                # w1, w3 (E, Im, H) -> gate_up_proj (E, 2*Im, H), gate rows first; w2 -> down_proj.
                pre = "model." + name.rsplit("/", 1)[0].replace("/", ".") + "."
                leaf = name.rsplit("/", 1)[1]
                im = t.shape[1] if leaf != "w2" else None
                if leaf == "w1":
                    put(pre + "gate_up_proj", t, slice(0, im))
                elif leaf == "w3":
                    put(pre + "gate_up_proj", t, slice(im, 2 * im))
                else:
                    put(pre + "down_proj", t)
                continue
            if name.endswith("/conv/conv"):
                t = t.unsqueeze(1)  # (H, L) -> (H, 1, L)
            put(hf_name(name), t)
    missing = sorted(set(k for k in want if "pos_emb" not in k) - filled)
    if missing:
        raise ToolError(f"{path}: the file lacks {len(missing)} tensors transformers needs, e.g. {missing[:3]}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model, cfg


def write_h5(path, datasets, attrs, inputs):
    """An HDF5 file written whole or not at all (tool_cli.atomic_output), never over an input."""
    with atomic_output(path, "output", inputs) as tmp:
        with h5py.File(tmp, "w") as f:
            for k, v in datasets.items():
                f.create_dataset(k, data=v)
            for k, v in attrs.items():
                f.attrs[k] = v


def run(model, ids, batch):
    """Last-position logits (N, V) and, per sequence, the smallest margin between the k-th and
    (k+1)-th routing score over every MoE layer and token (where a tiny numeric difference could
    pick another expert)."""
    gaps = []
    from router_margin import hook_routers

    handles = hook_routers(model, lambda m: gaps[-1].append(m.reshape(current[0], -1).min(dim=1).values))
    logits, per_seq = [], []
    current = [0]
    try:
        with torch.no_grad():
            for b in range(0, ids.shape[0], batch):
                chunk = ids[b:b + batch].to(next(model.parameters()).device)
                current[0] = chunk.shape[0]
                gaps.append([])
                out = model(input_ids=chunk, use_cache=False)
                logits.append(out.logits[:, -1, :].float().cpu())
                per_seq.append(torch.stack(gaps[-1]).min(dim=0).values.cpu() if gaps[-1]
                               else torch.full((chunk.shape[0],), float("inf")))
    finally:
        for h in handles:
            h.remove()
    return torch.cat(logits).numpy().astype(np.float32), torch.cat(per_seq).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("inputs")
    ap.add_argument("answers")
    ap.add_argument("--make-inputs", metavar="NxS", help="first write INPUTS with N random sequences of S tokens")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--batch", type=int, default=16, help="sequences per forward call")
    ap.add_argument("--device", default="cpu", help="torch device to run on (cpu, cuda)")
    ap.add_argument("--min-router-gap", type=float, default=2e-6,
                    help="with --make-inputs, redraw sequences whose routing has a closer near-tie")
    args = ap.parse_args()
    # Every path is checked before minutes of loading: the inputs exist (or, with --make-inputs, are
    # written), the outputs are no inputs, devices or FIFOs.
    check_input(args.model, "model")
    if args.make_inputs:
        output_target(args.inputs, "inputs", [args.model])
    else:
        check_input(args.inputs, "inputs")
    output_target(args.answers, "answers", [args.model, args.inputs])
    import_deps()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    # fp32 answers mean exact fp32 on a GPU too: TF32 would round every matmul's inputs to 10 mantissa
    # bits, and the short conv is an nn.Conv1d, which cuDNN runs in TF32 by default.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, cfg = load_model(args.model, args.device)
    if args.make_inputs:
        try:
            n, s = (int(x) for x in args.make_inputs.lower().split("x"))
            assert n > 0 and s > 0
        except (ValueError, AssertionError):
            raise ToolError(f"--make-inputs {args.make_inputs}: expected NxS with N, S > 0 (e.g. 1024x32)") from None
        rng = np.random.default_rng(args.seed)
        ids = torch.from_numpy(rng.integers(0, cfg.vocab_size, size=(n, s), dtype=np.int64))
        # A routing near-tie lets a one-ulp difference pick another expert; such a sequence is not a
        # fair test of agreement, so it is redrawn (deterministically, from the same generator).
        logits, gaps = run(model, ids, args.batch)
        for _ in range(100):
            close = np.nonzero(gaps < args.min_router_gap)[0]
            if len(close) == 0:
                break
            print(f"hf_answers: redrawing {len(close)} sequence(s) with routing near-ties: {close.tolist()}", flush=True)
            for i in close:
                ids[i] = torch.from_numpy(rng.integers(0, cfg.vocab_size, size=(s,), dtype=np.int64))
            # Sequences are independent: rerun only the redrawn ones.
            logits[close], gaps[close] = run(model, ids[close], args.batch)
        else:
            raise ToolError("could not draw inputs without routing near-ties; lower --min-router-gap")
        write_h5(args.inputs, {"input_ids": ids.numpy().astype(np.int32)}, {"seed": args.seed}, [args.model])
    else:
        try:
            with h5py.File(args.inputs, "r") as f:
                ids = torch.from_numpy(f["input_ids"][()].astype(np.int64))
        except (OSError, KeyError):
            raise ToolError(f"inputs {args.inputs}: not an HDF5 file with input_ids") from None
        logits, gaps = run(model, ids, args.batch)
    top = logits.argmax(axis=-1).astype(np.int32)
    sorted_ = np.sort(logits, axis=-1)
    gap = float((sorted_[:, -1] - sorted_[:, -2]).min())
    import transformers
    write_h5(args.answers, {"next_token": top, "logits": logits, "router_gap": gaps.astype(np.float32)},
             {"source": "transformers Lfm2MoeForCausalLM fp32 eager",
              "transformers_version": str(transformers.__version__),
              "torch_version": str(torch.__version__), "model": os.path.basename(args.model),
              "min_router_gap": float(gaps.min())}, [args.model, args.inputs])
    print(f"hf_answers: wrote {args.answers}: {ids.shape[0]} x {ids.shape[1]} tokens, vocab {logits.shape[1]}, "
          f"smallest top-1/top-2 gap {gap:.3g}, smallest routing gap {float(gaps.min()):.3g}")


if __name__ == "__main__":
    sys.exit(run_tool(TOOL, main))
