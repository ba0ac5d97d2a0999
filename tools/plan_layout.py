#!/usr/bin/env python3
"""Proposes R x P for lfm2-rank on a machine: R replicas of a P-stage pipeline (--pipeline P).

    python3 tools/plan_layout.py --config config.json --sequences 1024 --seq-len 32
    python3 tools/plan_layout.py --model model.h5 --sequences 256 --seq-len 8192 --new-tokens 2048
    python3 tools/plan_layout.py --config config.json --gpus 4 --memory-gib 80 ...   # no nvidia-smi

Replicas move no hidden states and have no pipeline bubble, so the best layout is the largest R
whose stage fits in one GPU's memory: one whole model per GPU (R = GPUs, P = 1) where it fits, and
the model cut into P stages only when its weights, the batch's activations and the generation cache
(KV cache and conv state of a replica's sequences) do not. For each P dividing the GPU count (and
at most the layer count) it estimates the largest stage's memory: its weights in the compute dtype
(layers split as evenly as lfm2-rank splits them; the embedding on the first stage, the tied head
on the last), the generation state of ceil(N / R) sequences, the hidden-state buffers and scratch
of a microbatch, and a reserve for the CUDA context, NCCL and the allocator. The figures are
estimates: lfm2-rank prints what each stage really holds and has free (the plan lines).

The GPUs: --gpus and --memory-gib, or `nvidia-smi --query-gpu=memory.total --format=csv,noheader,
nounits` (run here, or its saved output given with --nvidia-smi FILE; the smallest GPU counts).
The model: --config (a Hugging Face config.json) or --model (an h5pack weight file; needs h5py).
Standard library only (h5py for --model). Exit 0 with a proposal, 1 when no layout fits.
"""
import argparse
import json
import math
import subprocess
import sys

from tool_cli import ToolError, check_input, open_h5, run

TOOL = "plan_layout"

GIB = 1 << 30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def read_config(args):
    """The Hugging Face config: --config's JSON, or the config_json attribute of --model's file."""
    if args.config:
        with open(check_input(args.config, "--config"), encoding="utf-8") as f:
            try:
                c = json.load(f)
            except ValueError as e:
                raise ToolError(f"--config {args.config}: not JSON ({e})") from None
    else:
        with open_h5(TOOL, args.model, "--model") as f:
            if "config_json" not in f.attrs:
                raise ToolError(f"--model {args.model}: no config_json attribute (not an h5pack weight file)")
            text = f.attrs["config_json"]
        c = json.loads(text if isinstance(text, str) else text.decode())
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                           "num_key_value_heads") if not isinstance(c, dict) or not isinstance(c.get(k), int)]
    if missing:
        raise ToolError(f"{args.config or args.model}: the config lacks whole numbers for {', '.join(missing)}")
    return c


def read_gpus(args):
    """(count, memory in bytes of the smallest) from the arguments or nvidia-smi's csv."""
    if args.gpus:
        if not args.memory_gib:
            sys.exit("plan_layout: error: --gpus needs --memory-gib")
        return args.gpus, int(args.memory_gib * GIB)
    if args.nvidia_smi:
        with open(check_input(args.nvidia_smi, "--nvidia-smi"), encoding="utf-8") as f:
            text = f.read()
    else:
        cmd = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
        try:
            text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"plan_layout: error: {' '.join(cmd)} failed ({e}); give --gpus and --memory-gib")
    try:
        mib = [float(x.split()[0]) for x in text.splitlines() if x.strip()]
    except ValueError:
        raise ToolError("the nvidia-smi output holds a line that is not a memory size in MiB") from None
    if not mib:
        sys.exit("plan_layout: error: nvidia-smi listed no GPU; give --gpus and --memory-gib")
    return len(mib), int(min(mib) * (1 << 20))


class Model:
    """The sizes that matter for memory, from the Hugging Face config keys."""

    def __init__(self, c):
        self.V, self.H, self.L = c["vocab_size"], c["hidden_size"], c["num_hidden_layers"]
        self.I, self.Im = c.get("intermediate_size", 7168), c.get("moe_intermediate_size", 1792)
        self.E, self.k = c.get("num_experts", 32), c.get("num_experts_per_tok", 4)
        self.nh, self.nkv = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = self.H // self.nh
        self.dense = c.get("num_dense_layers", 2)
        self.conv_l = c.get("conv_L_cache", 3)
        types = c.get("layer_types")
        if types is None:  # legacy: full_attn_idxs
            idx = set(c.get("full_attn_idxs", []))
            types = ["full_attention" if i in idx else "conv" for i in range(self.L)]
        self.attention = [t == "full_attention" for t in types]

    def layer_bytes(self, il, b):
        """One layer's weights: matrices in the compute dtype (b bytes), vectors in fp32."""
        H, hd = self.H, self.hd
        mats, vecs = 0, 2 * H  # operator_norm, ffn_norm
        if self.attention[il]:
            mats += H * self.nh * hd * 2 + H * self.nkv * hd * 2  # q, o; k, v
            vecs += 2 * hd  # q and k layernorms
        else:
            mats += 4 * H * H  # in_proj (3H x H), out_proj
            vecs += H * self.conv_l
        if il >= self.dense:
            mats += self.E * 3 * H * self.Im + self.E * H  # experts, router
            vecs += self.E  # expert bias
        else:
            mats += 3 * H * self.I
        return mats * b + vecs * 4

    def stage_layers(self, P):
        """Layer ranges as lfm2-rank's balanced split gives them here: as even as possible."""
        base, extra = divmod(self.L, P)
        out, begin = [], 0
        for s in range(P):
            n = base + (1 if s < extra else 0)
            out.append(range(begin, begin + n))
            begin += n
        return out


def stage_estimate(m, layers, first, last, a):
    """Bytes of one stage: weights, generation state, activations (a: the run's arguments)."""
    b = DTYPE_BYTES[a.dtype]
    weights = sum(m.layer_bytes(il, b) for il in layers)
    if first or last:
        weights += m.V * m.H * b  # the embedding; tied, it is the head too (one copy per stage)
    if last:
        weights += m.H * 4
    state = 0
    if a.new_tokens > 0:
        positions = a.seq_len + a.new_tokens - 1
        n = a.replica_sequences
        for il in layers:
            if m.attention[il]:
                state += 2 * n * positions * m.nkv * m.hd * b  # k and v
            else:
                state += n * (m.conv_l - 1) * m.H * 4
    t = min(a.microbatch_tokens, a.replica_sequences * a.seq_len)
    big = max((m.nh + 2 * m.nkv) * m.hd, 3 * m.H, 2 * m.I)
    mid = max(m.nh * m.hd, m.H, m.I)
    scratch = t * ((m.H + big + mid) * b + m.E * 4 + 8 * m.k + m.k * (2 * m.H + 3 * m.Im) * b)
    act = 3 * t * m.H * 4 + scratch  # three fp32 hidden-state buffers, a layer's scratch
    if last:
        act += 2 * 256 * m.V * 4  # the head's logits slots
    return weights, state, act


def candidates(gpus, L):
    return [p for p in range(1, gpus + 1) if gpus % p == 0 and p <= L]


def plan(m, gpus, mem, a):
    """Rows (R, P, worst stage: weights, state, activations, total, fits), largest R first."""
    usable = mem * (1 - a.reserve_frac) - a.reserve_gib * GIB
    rows = []
    for P in candidates(gpus, m.L):
        R = gpus // P
        a.replica_sequences = math.ceil(a.sequences / R)
        worst = max(
            (stage_estimate(m, r, s == 0, s == P - 1, a) for s, r in enumerate(m.stage_layers(P))),
            key=sum,
        )
        rows.append((R, P) + worst + (sum(worst), sum(worst) <= usable))
    return rows, usable


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="a Hugging Face config.json")
    src.add_argument("--model", help="an h5pack weight file (its config_json attribute; needs h5py)")
    ap.add_argument("--gpus", type=int, help="GPUs on the node (default: from nvidia-smi)")
    ap.add_argument("--memory-gib", type=float, help="memory of each GPU, GiB (with --gpus)")
    ap.add_argument("--nvidia-smi",
                    help="saved output of nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits")
    ap.add_argument("--sequences", type=int, required=True, help="N: sequences of the whole job")
    ap.add_argument("--seq-len", type=int, required=True, help="S: tokens per prompt (padded)")
    ap.add_argument("--new-tokens", type=int, default=0, help="K: --max-new-tokens (0: scoring)")
    ap.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bf16")
    ap.add_argument("--microbatch-tokens", type=int, default=16384,
                    help="tokens per microbatch (default 16384, the most lfm2-rank's default takes)")
    ap.add_argument("--reserve-gib", type=float, default=1.5, help="CUDA context, NCCL, allocator (GiB)")
    ap.add_argument("--reserve-frac", type=float, default=0.05, help="and this share of each GPU")
    ap.add_argument("--json", action="store_true", help="print the table as JSON")
    a = ap.parse_args(argv)
    for name in ("sequences", "seq_len", "microbatch_tokens"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.new_tokens < 0:
        ap.error("--new-tokens must be at least 0")

    m = Model(read_config(a))
    gpus, mem = read_gpus(a)
    rows, usable = plan(m, gpus, mem, a)
    fitting = [r for r in rows if r[-1]]
    best = fitting[0] if fitting else None
    if a.json:
        keys = ["replicas", "stages", "weights", "state", "activations", "total", "fits"]
        print(json.dumps({"gpus": gpus, "gpu_bytes": mem, "usable_bytes": int(usable),
                          "layouts": [dict(zip(keys, r)) for r in rows],
                          "proposal": dict(zip(keys, best)) if best else None}, indent=1))
    else:
        job = f"{a.sequences} x {a.seq_len}" + (f" + {a.new_tokens} new tokens" if a.new_tokens else "")
        print(f"plan_layout: {gpus} GPUs of {mem / GIB:.1f} GiB ({usable / GIB:.1f} usable), {a.dtype}, {job}, "
              f"{m.L} layers")
        print(f"{'R x P':>7}  {'weights':>8}  {'state':>8}  {'activ.':>8}  {'stage':>8}  fits (GiB, the largest stage)")
        for R, P, w, s, act, tot, fits in rows:
            print(f"{R:>3} x {P:<2} {w / GIB:8.2f}  {s / GIB:8.2f}  {act / GIB:8.2f}  {tot / GIB:8.2f}  "
                  f"{'yes' if fits else 'no'}")
    if not best:
        print(f"plan_layout: no layout fits: the largest stage needs {min(r[5] for r in rows) / GIB:.1f} GiB even at "
              f"P = {rows[-1][1]}, {usable / GIB:.1f} GiB usable per GPU (fewer sequences or new tokens, or more GPUs)",
              file=sys.stderr)
        return 1
    R, P = best[0], best[1]
    if not a.json:
        why = "one whole model per GPU: no bubble, no transfers" if P == 1 else \
            f"the model needs {P} GPUs per copy at this batch and cache"
        print(f"proposal: R x P = {R} x {P} ({why})")
        print(f"  mpirun -np {R * P} lfm2-rank --pipeline {P} --dtype {a.dtype} ...")
    return 0


if __name__ == "__main__":
    sys.exit(run(TOOL, main))
