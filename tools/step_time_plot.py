#!/usr/bin/env python3
"""Draws the decode step's time against the cache length at batch 32 (one GPU, the full-size model,
P = 1) beside its memory floor, from cuda_bench_step's log (lines `step B=32   C=1024   6.893 ms ...
floor 5.605 ms ...`), with the step times issue 26 measured before the paged flash-decoding kernel.

    python3 tools/step_time_plot.py BENCH_STEP.log docs/img/decode_step_time.svg

The format follows the output's suffix (svg, png, pdf). Needs matplotlib."""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tool_cli import ToolError, atomic_output, check_input, need, run  # noqa: E402

TOOL = "step_time_plot"
BEFORE = {1024: 14.8, 4096: 30.0, 8192: 50.0}  # ms a step, issue 26 (one warp per head, position by position)
LINE = re.compile(r"step B=32\s+C=(\d+)\s+([\d.]+) ms.*floor ([\d.]+) ms")


def read_steps(path):
    with open(check_input(path, "log"), encoding="utf-8", errors="replace") as f:
        rows = [(int(m[1]), float(m[2]), float(m[3])) for m in map(LINE.match, f) if m]
    if not rows:
        raise ToolError(f"{path}: no 'step B=32 C=... ms ... floor ... ms' lines (cuda_bench_step's output)")
    return sorted(rows)


def draw(rows, out, fmt, log):
    matplotlib = need(TOOL, "matplotlib")
    matplotlib.use("Agg")
    plt = need(TOOL, "matplotlib.pyplot")
    c, t, f = zip(*rows)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.plot(c, t, "o-", label="decode step (paged flash-decoding)")
    ax.plot(c, f, "s--", label="memory floor (weights + KV at copy bandwidth)")
    before = sorted(BEFORE)
    ax.plot(before, [BEFORE[k] for k in before], "x:", color="gray", label="before (issue 26)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cached positions per sequence (batch 32)")
    ax.set_ylabel("ms per decode step")
    ax.set_title("LFM2-8B-A1B decode step, bf16, P = 1")
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_output(out, "plot", inputs=[log]) as tmp:
        fig.savefig(tmp, format=fmt)


def main(argv):
    ap = argparse.ArgumentParser(prog=TOOL, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="cuda_bench_step's output")
    ap.add_argument("out", help="the plot to write (.svg, .png, .pdf)")
    args = ap.parse_args(argv)
    fmt = os.path.splitext(args.out)[1].lstrip(".").lower()
    if fmt not in ("svg", "png", "pdf"):
        raise ToolError(f"plot {args.out}: name it .svg, .png or .pdf (the format follows the suffix)")
    rows = read_steps(args.log)
    draw(rows, args.out, fmt, args.log)
    print(f"{TOOL}: {len(rows)} cache lengths -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run(TOOL, main, sys.argv[1:]))
