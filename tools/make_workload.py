#!/usr/bin/env python3
"""Makes a generation workload for lfm2-rank's continuous batching (issue 20): N prompts of random
token ids whose lengths and per-sequence max_new_tokens are drawn from long-tailed (log-normal)
distributions, clipped to a range, seeded: the same arguments give the same file, byte for byte.

    python3 tools/make_workload.py --out work.h5 --n 20000 --seed 0        # the issue's shape
    python3 tools/make_workload.py --out uniform.h5 --n 20000 --seed 0 --uniform
    python3 tools/make_workload.py --out small.h5 --n 400 --vocab 256 --prompt 4:96:16 --new 1:48:8

--prompt and --new are MIN:MAX:MEDIAN (defaults 16:4096:128 and 1:1024:64, sigma 1.0 in log space:
means about 210 and 105, tails to the limits);
--uniform gives every sequence the workload's mean prompt length and mean max_new_tokens (the same
draws, so the same N and, up to rounding, the same total tokens): the uniform batch the long-tailed
one is compared with. Ids are uniform in [--first-id, --vocab).

The file is lfm2-rank's inputs format (docs/text.md, "The inputs file"): input_ids int32 (N, S)
right-padded with 0 (chunked by 64 rows and compressed: a job reads it in blocks), lengths int32 (N),
max_new_tokens int32 (N); temperature, top_p, top_k, seed stay the run's flags (-1). --no-params
leaves the per-sequence datasets out (a fixed shape for --scheduler static: --prompt 8192:8192:8192
--new 2048:2048:2048 --n 32). It prints the workload's totals and quantiles. Needs numpy and h5py.
"""
import argparse
import sys

from tool_cli import ToolError, atomic_output, need, run

TOOL = "make_workload"


def parse_range(text, name):
    try:
        lo, hi, median = (int(x) for x in text.split(":"))
    except ValueError:
        raise ToolError(f"--{name} {text}: expected MIN:MAX:MEDIAN, three whole numbers") from None
    if not (1 <= lo <= median <= hi):
        raise ToolError(f"--{name} {text}: needs 1 <= MIN <= MEDIAN <= MAX")
    return lo, hi, median


def draw(rng, np, n, lo, hi, median, sigma):
    """n long-tailed values: log-normal around `median`, rounded, clipped to [lo, hi]."""
    v = np.exp(rng.normal(np.log(median), sigma, size=n))
    return np.clip(np.rint(v), lo, hi).astype(np.int64)


def quantile_text(np, v):
    q = np.percentile(v, [50, 90, 99], method="nearest")
    return f"mean {v.mean():.1f}, p50 {q[0]}, p90 {q[1]}, p99 {q[2]}, max {v.max()}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the inputs file to write (HDF5)")
    ap.add_argument("--n", type=int, default=20000, help="sequences (default 20000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=65536, help="ids are below this (LFM2: 65536)")
    ap.add_argument("--first-id", type=int, default=14, help="the lowest id (LFM2's special tokens are 0-13)")
    ap.add_argument("--prompt", default="16:4096:128", help="prompt lengths MIN:MAX:MEDIAN")
    ap.add_argument("--new", default="1:1024:64", help="max_new_tokens MIN:MAX:MEDIAN")
    ap.add_argument("--sigma", type=float, default=1.0, help="the spread in log space (larger: longer tails)")
    ap.add_argument("--uniform", action="store_true", help="every sequence at the workload's means")
    ap.add_argument("--no-params", action="store_true", help="no per-sequence datasets (the flags decide)")
    args = ap.parse_args(argv)
    np, h5py = need(TOOL, "numpy"), need(TOOL, "h5py")
    if args.n < 1:
        raise ToolError(f"--n {args.n}: at least 1 sequence")
    if not 0 <= args.first_id < args.vocab:
        raise ToolError(f"--first-id {args.first_id} is not below --vocab {args.vocab}")
    p_lo, p_hi, p_med = parse_range(args.prompt, "prompt")
    n_lo, n_hi, n_med = parse_range(args.new, "new")
    rng = np.random.default_rng(args.seed)
    lengths = draw(rng, np, args.n, p_lo, p_hi, p_med, args.sigma)
    new = draw(rng, np, args.n, n_lo, n_hi, n_med, args.sigma)
    if args.uniform:
        lengths = np.full(args.n, int(round(lengths.mean())), dtype=np.int64)
        new = np.full(args.n, int(round(new.mean())), dtype=np.int64)
    width = int(lengths.max())
    with atomic_output(args.out, "--out") as tmp, h5py.File(tmp, "w") as f:
        ids = f.create_dataset("input_ids", shape=(args.n, width), dtype=np.int32, chunks=(min(64, args.n), width),
                               compression="gzip", compression_opts=1, fillvalue=0)
        for b in range(0, args.n, 1024):
            e = min(args.n, b + 1024)
            block = np.zeros((e - b, width), dtype=np.int32)
            for i in range(b, e):
                block[i - b, :lengths[i]] = rng.integers(args.first_id, args.vocab, size=lengths[i], dtype=np.int32)
            ids[b:e] = block
        f.create_dataset("lengths", data=lengths.astype(np.int32))
        if not args.no_params:
            f.create_dataset("max_new_tokens", data=new.astype(np.int32))
            for name, dtype in (("temperature", np.float32), ("top_p", np.float32), ("top_k", np.int32),
                                ("seed", np.int64)):
                f.create_dataset(name, data=np.full(args.n, -1, dtype=dtype))
        f.attrs["format"] = "lfm2-rank-inputs"
        f.attrs["per_sequence_default"] = -1
        f.attrs["workload"] = (f"make_workload.py --n {args.n} --seed {args.seed} --vocab {args.vocab} --prompt "
                               f"{args.prompt} --new {args.new} --sigma {args.sigma}" + (" --uniform" if args.uniform else "")
                               + (" --no-params" if args.no_params else ""))
    print(f"{args.out}: {args.n} sequences, width {width}; prompt tokens {int(lengths.sum())} "
          f"({quantile_text(np, lengths)}); max_new_tokens {int(new.sum())} ({quantile_text(np, new)})")
    return 0


if __name__ == "__main__":
    sys.exit(run(TOOL, main))
