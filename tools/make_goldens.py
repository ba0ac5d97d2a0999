#!/usr/bin/env python3
"""Golden files for the C++ tests: small random LFM2-MoE models run by Hugging Face transformers.

For each case below: build an Lfm2MoeConfig, init Lfm2MoeForCausalLM randomly (fixed seed), perturb
the norms and expert_bias away from 1 / 0, save_pretrained into tests/golden/data/<case>/, reload
that checkpoint in fp32 with eager attention and the eager expert loop (the code path of
modeling_lfm2_moe.py), run it on random token ids, and write golden.h5 next to the checkpoint:

  input_ids   int32   (N, S)
  logits      float32 (N, V)     last position
  logits_all  float32 (N, S, V)  every position
  next_token  int32   (N)        top-1 of the last position
  inv_freq    float32 (hd/2)     HF's RoPE inverse frequencies
  attributes: case, description, seed, transformers / torch versions, min_router_gap, min_top1_gap

and generate.h5, transformers' greedy `generate` of every case on ragged prompts (each prompt run
alone, so that padding plays no part), which is both an inputs and an answers file of lfm2-rank:

  input_ids   int32   (N, S)     prompts, right-padded with 0
  lengths     int32   (N)        prompt lengths (1..S, ragged)
  generated   int32   (N, K)     the K = 8 greedy tokens after each prompt
  next_token  int32   (N)        the first of them

Guards against false failures: every router's k-th vs (k+1)-th selection score and every top-1
logit must be separated by a margin (otherwise the case is re-drawn with the next seed), because a
1-ulp difference could legitimately flip a near-tie; for generation at every step of every prompt.

expert_bias: HF creates it as a float32 buffer; from_pretrained keeps it float32 even with
dtype=bfloat16 (bf16 file values are widened), but model.to(bfloat16) casts it and save_pretrained
then writes it as BF16, as in the bf16 case here. h5pack stores it fp32 either way.
torch.topk on the CPU does not order equal values by index (e.g. topk([0, 0, 0, 0], 2) gives
[2, 3]), so exact ties cannot be matched and are excluded by the router margin above.

Usage: python3 tools/make_goldens.py [--out tests/golden/data] [--only CASE ...]
"""
import argparse
import json
import os
import shutil
import sys

from tool_cli import ToolError, atomic_output, need, run

TOOL = "make_goldens"
# Imported by import_deps() once the arguments are read: --help needs none of them.
h5py = np = torch = transformers = load_file = save_file = Lfm2MoeConfig = Lfm2MoeForCausalLM = hook_routers = None


def import_deps():
    global h5py, np, torch, transformers, load_file, save_file, Lfm2MoeConfig, Lfm2MoeForCausalLM, hook_routers
    h5py, np, torch, transformers = (need(TOOL, m) for m in ("h5py", "numpy", "torch", "transformers"))
    st = need(TOOL, "safetensors.torch")
    load_file, save_file = st.load_file, st.save_file
    Lfm2MoeConfig, Lfm2MoeForCausalLM = transformers.Lfm2MoeConfig, transformers.Lfm2MoeForCausalLM
    from router_margin import hook_routers

ROUTER_GAP = 1e-4   # min |score_k - score_{k+1}| over every token of every MoE layer
TOP1_GAP = 1e-4     # min relative gap between the best and second-best logit

# name -> (description, config overrides, extras)
CASES = {
    "tied_gqa2_top2": (
        "tied head, conv+attention, dense+MoE, GQA 2, top-2 renormalised, default theta, 3 x 12 tokens",
        dict(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, num_dense_layers=1, num_experts=8, num_experts_per_tok=2,
             layer_types=["conv", "full_attention", "conv", "full_attention"], norm_topk_prob=True),
        dict(n_seq=3, seq_len=12),
    ),
    "untied_mha_top1_long": (
        "untied head, GQA 1, top-1 without renormalisation, routed_scaling_factor 2.5, theta 1e4, 2 x 70 tokens",
        dict(vocab_size=80, hidden_size=24, intermediate_size=40, moe_intermediate_size=12, num_hidden_layers=3,
             num_attention_heads=3, num_key_value_heads=3, num_dense_layers=1, num_experts=6, num_experts_per_tok=1,
             layer_types=["full_attention", "conv", "full_attention"], norm_topk_prob=False,
             routed_scaling_factor=2.5, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        dict(n_seq=2, seq_len=70),
    ),
    "bf16_gqa4_top3_seq1": (
        "bf16 checkpoint (reference computed in fp32 from the bf16 weights), GQA 4, top-3, two dense layers, 5 x 1 token",
        dict(vocab_size=64, hidden_size=32, intermediate_size=40, moe_intermediate_size=8, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2, num_dense_layers=2, num_experts=8, num_experts_per_tok=3,
             layer_types=["conv", "full_attention", "full_attention", "conv"], norm_topk_prob=True),
        dict(n_seq=5, seq_len=1, bf16=True),
    ),
    "fused_experts_nobias": (
        "experts saved in the fused spelling (gate_up_proj / down_proj), no expert bias, all layers MoE, "
        "theta 5e5, 4 x 33 tokens",
        dict(vocab_size=72, hidden_size=16, intermediate_size=24, moe_intermediate_size=8, num_hidden_layers=3,
             num_attention_heads=2, num_key_value_heads=1, num_dense_layers=0, num_experts=5, num_experts_per_tok=2,
             layer_types=["conv", "conv", "full_attention"], norm_topk_prob=True, use_expert_bias=False,
             rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
        dict(n_seq=4, seq_len=33, fused=True),
    ),
    "gqa2_hd16_gpu": (
        "head_dim 16 (the CUDA backend's smallest), GQA 2, top-2, one dense layer, 2 x 20 tokens: the GPU "
        "generation tests' checkpoint",
        dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, num_dense_layers=1, num_experts=8, num_experts_per_tok=2,
             layer_types=["conv", "full_attention", "conv", "full_attention"], norm_topk_prob=True),
        dict(n_seq=2, seq_len=20),
    ),
}


def perturb(model, gen):
    """Make norms and expert_bias non-trivial (default init leaves them at 1 and 0)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))  # also fills the zeroed padding row
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))


def router_gap(model, input_ids):
    """Smallest margin between the k-th and (k+1)-th routing score over every MoE layer and token."""
    gaps = []
    handles = hook_routers(model, lambda m: gaps.append(m.min().item()))
    with torch.no_grad():
        model(input_ids=input_ids)
    for h in handles:
        h.remove()
    return min(gaps) if gaps else float("inf")


def top1_gap(logits):
    top = torch.topk(logits, 2, dim=-1).values
    return ((top[..., 0] - top[..., 1]) / top[..., 0].abs().clamp_min(1e-30)).min().item()


def fuse_experts(ckpt_dir, cfg):
    """Rewrite model.safetensors with experts.gate_up_proj (E, 2Im, H) / experts.down_proj (E, H, Im)."""
    path = os.path.join(ckpt_dir, "model.safetensors")
    tensors = load_file(path)
    out = {}
    for il in range(cfg.num_hidden_layers):
        pre = f"model.layers.{il}.feed_forward.experts."
        if f"{pre}0.w1.weight" not in tensors:
            continue
        E = cfg.num_experts
        w1 = torch.stack([tensors.pop(f"{pre}{e}.w1.weight") for e in range(E)])
        w3 = torch.stack([tensors.pop(f"{pre}{e}.w3.weight") for e in range(E)])
        w2 = torch.stack([tensors.pop(f"{pre}{e}.w2.weight") for e in range(E)])
        out[pre + "gate_up_proj"] = torch.cat([w1, w3], dim=1).contiguous()  # gate rows first
        out[pre + "down_proj"] = w2.contiguous()
    out.update(tensors)
    save_file(out, path, metadata={"format": "pt"})


def load_reference(ckpt_dir):
    return Lfm2MoeForCausalLM.from_pretrained(ckpt_dir, dtype=torch.float32, attn_implementation="eager",
                                              experts_implementation="eager").eval()


def make_case(name, out_root, base_seed):
    desc, overrides, extra = CASES[name]
    case_dir = os.path.join(out_root, name)
    for attempt in range(20):
        seed = base_seed + attempt
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        cfg = Lfm2MoeConfig(initializer_range=0.2, **overrides)
        model = Lfm2MoeForCausalLM(cfg).eval()
        perturb(model, gen)
        if extra.get("bf16"):
            model = model.to(torch.bfloat16)
        shutil.rmtree(case_dir, ignore_errors=True)
        model.save_pretrained(case_dir)
        if extra.get("fused"):
            before = load_reference(case_dir)
            fuse_experts(case_dir, cfg)
        ref = load_reference(case_dir)
        if extra.get("fused"):  # the fused file must load to the same model
            for (n1, p1), (n2, p2) in zip(before.state_dict().items(), ref.state_dict().items()):
                assert n1 == n2 and torch.equal(p1, p2), f"{name}: fused checkpoint differs at {n1}"
        ids = torch.randint(0, cfg.vocab_size, (extra["n_seq"], extra["seq_len"]), generator=gen)
        with torch.no_grad():
            logits = ref(input_ids=ids).logits.float()
        rgap, tgap = router_gap(ref, ids), top1_gap(logits[:, -1])
        if rgap >= ROUTER_GAP and tgap >= TOP1_GAP:
            break
        print(f"{name}: seed {seed} has a near tie (router gap {rgap:.2e}, top-1 gap {tgap:.2e}); next seed")
    else:
        raise ToolError(f"{name}: no seed without near ties")

    with atomic_output(os.path.join(case_dir, "golden.h5")) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("input_ids", data=ids.numpy().astype(np.int32))
        f.create_dataset("logits", data=logits[:, -1].numpy())
        f.create_dataset("logits_all", data=logits.numpy())
        f.create_dataset("next_token", data=logits[:, -1].argmax(-1).numpy().astype(np.int32))
        f.create_dataset("inv_freq", data=ref.model.pos_emb.inv_freq.float().numpy())
        f.attrs["case"] = name
        f.attrs["description"] = desc
        f.attrs["seed"] = seed
        f.attrs["transformers_version"] = str(transformers.__version__)
        f.attrs["torch_version"] = str(torch.__version__)
        f.attrs["min_router_gap"] = rgap
        f.attrs["min_top1_gap"] = tgap
    with open(os.path.join(case_dir, "config.json")) as fh:
        keys = json.load(fh)
    print(f"{name}: seed {seed}, dtype {keys.get('dtype')}, ids {tuple(ids.shape)}, max|logit| "
          f"{logits.abs().max().item():.3f}, router gap {rgap:.2e}, top-1 gap {tgap:.2e}")


GEN_NEW = 8        # new tokens per prompt
GEN_PROMPTS = 4    # prompts per case, of ragged lengths


def generate_alone(ref, prompt):
    """Greedy generate of one prompt; returns (tokens, smallest top-1 gap, smallest router gap)."""
    gaps = []
    handles = hook_routers(ref, lambda m: gaps.append(m.min().item()))
    # Plain greedy: no end-of-sequence id (the checkpoint's generation_config says 2, and min_new_tokens
    # would then suppress that token instead of taking the argmax), so exactly GEN_NEW argmax tokens.
    ref.generation_config.eos_token_id = None
    # The attention mask is given: generate would otherwise mask every token equal to pad_token_id.
    with torch.no_grad():
        out = ref.generate(prompt[None, :], attention_mask=torch.ones_like(prompt[None, :]), max_new_tokens=GEN_NEW,
                           do_sample=False, return_dict_in_generate=True, output_logits=True, pad_token_id=0)
    assert out.sequences.shape[1] == prompt.shape[0] + GEN_NEW
    for h in handles:
        h.remove()
    tgap = min(top1_gap(step.float()) for step in out.logits)
    return out.sequences[0, prompt.shape[0]:], tgap, min(gaps) if gaps else float("inf")


def make_generate(name, case_dir, seed):
    """generate.h5: ragged prompts and transformers' greedy continuation of each, run alone."""
    ref = load_reference(case_dir)
    vocab = ref.config.vocab_size
    for attempt in range(50):
        gen = torch.Generator().manual_seed(seed * 7 + attempt)
        lengths = [int(torch.randint(1, 13, (1,), generator=gen)) for _ in range(GEN_PROMPTS)]
        lengths[0] = 12  # one full row
        S = max(lengths)
        ids = torch.zeros((GEN_PROMPTS, S), dtype=torch.long)
        tokens, tgap, rgap = [], float("inf"), float("inf")
        for i, n in enumerate(lengths):
            ids[i, :n] = torch.randint(0, vocab, (n,), generator=gen)
            t, g1, g2 = generate_alone(ref, ids[i, :n])
            tokens.append(t)
            tgap, rgap = min(tgap, g1), min(rgap, g2)
        if rgap >= ROUTER_GAP and tgap >= TOP1_GAP:
            break
        print(f"{name}: generation draw {attempt} has a near tie (router gap {rgap:.2e}, top-1 gap {tgap:.2e})")
    else:
        raise ToolError(f"{name}: no prompts without near ties for generation")
    generated = torch.stack(tokens).numpy().astype(np.int32)
    with atomic_output(os.path.join(case_dir, "generate.h5")) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("input_ids", data=ids.numpy().astype(np.int32))
        f.create_dataset("lengths", data=np.array(lengths, dtype=np.int32))
        f.create_dataset("generated", data=generated)
        f.create_dataset("next_token", data=generated[:, 0].copy())
        f.attrs["case"] = name
        f.attrs["new_tokens"] = GEN_NEW
        f.attrs["transformers_version"] = str(transformers.__version__)
        f.attrs["torch_version"] = str(torch.__version__)
        f.attrs["min_router_gap"] = rgap
        f.attrs["min_top1_gap"] = tgap
    print(f"{name}: generate.h5 lengths {lengths}, {GEN_NEW} new tokens, router gap {rgap:.2e}, top-1 gap {tgap:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "golden", "data"))
    ap.add_argument("--only", nargs="*", default=None, help="cases to (re)build; default all")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--generate-only", action="store_true",
                    help="keep the checkpoints and golden.h5; write only generate.h5 from them")
    args = ap.parse_args()
    names = args.only or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise ToolError(f"--only: unknown case(s) {', '.join(unknown)} (known: {', '.join(CASES)})")
    if not os.path.isdir(args.out):
        raise ToolError(f"--out {args.out}: no such directory")
    import_deps()
    torch.set_num_threads(1)  # deterministic reductions
    for i, name in enumerate(names):
        seed = args.seed + 100 * list(CASES).index(name)
        if not args.generate_only:
            make_case(name, os.path.abspath(args.out), seed)
        make_generate(name, os.path.join(os.path.abspath(args.out), name), seed)


if __name__ == "__main__":
    sys.exit(run(TOOL, main))
