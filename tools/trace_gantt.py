#!/usr/bin/env python3
"""Draws an lfm2-rank timeline (`lfm2-rank --trace run.json`) as a Gantt chart PNG.

    python3 tools/trace_gantt.py run.json run.png [--title TEXT] [--width 14]

One band per rank, four rows in each: compute (embed / forward / head per microbatch), recv, send
and host (waits, queueing). Microbatch numbers are written on the bars where they fit. It also
prints each rank's busy time and the bubble the picture shows. Needs matplotlib (headless: Agg).
Exit codes: 0 drawn, 1 unreadable or malformed trace, 2 bad arguments.
"""
import argparse
import json
import math
import sys

from tool_cli import ToolError, atomic_output, check_input, need, output_target, run

TOOL = "trace_gantt"

TRACKS = ["compute", "recv", "send", "host"]
COLOURS = {"embed": "#8fbc8f", "forward": "#4682b4", "head": "#daa520", "recv": "#9370db", "send": "#cd5c5c",
           "queue": "#d3d3d3", "wait": "#ff8c00"}


def load(path):
    """Returns (meta, {rank: label}, [(rank, track, name, micro, begin_ms, end_ms)])."""
    with open(check_input(path, "trace"), encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except ValueError as e:
            raise ToolError(f"trace {path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or "traceEvents" not in doc:
        raise ToolError(f"trace {path}: no traceEvents: not an lfm2-rank trace")
    labels, spans = {}, []
    for e in doc["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            labels[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "X":
            micro = e.get("args", {}).get("microbatch", -1)
            try:
                t0 = float(e["ts"]) / 1e3
                spans.append((int(e["pid"]), int(e["tid"]), e["name"], micro, t0, t0 + float(e["dur"]) / 1e3))
            except (KeyError, TypeError, ValueError):
                raise ToolError(f"trace {path}: a malformed span: {json.dumps(e)[:120]}") from None
    if not spans:
        raise ToolError(f"trace {path}: the trace has no spans")
    return doc.get("otherData", {}), labels, spans


def colour(name):
    for key, c in COLOURS.items():
        if name.startswith(key):
            return c
    return "#999999"


def summary(labels, spans):
    end = max(s[5] for s in spans) - min(s[4] for s in spans)
    ranks = sorted({s[0] for s in spans})
    busy = {r: sum(s[5] - s[4] for s in spans if s[0] == r and s[1] == 0) for r in ranks}
    lines = [f"{labels.get(r, f'rank {r}')}: busy {busy[r]:.2f} ms of {end:.2f} ms ({100 * busy[r] / end:.1f}%)"
             for r in ranks]
    bubble = 1 - sum(busy.values()) / (len(ranks) * end) if end > 0 else 0
    lines.append(f"timeline {end:.2f} ms, bubble {100 * bubble:.1f}% (1 - sum busy / (ranks x timeline))")
    return lines


def draw(meta, labels, spans, out_path, title, width):
    matplotlib = need(TOOL, "matplotlib")
    matplotlib.use("Agg")
    plt = need(TOOL, "matplotlib.pyplot")
    Patch = need(TOOL, "matplotlib.patches").Patch

    ranks = sorted({s[0] for s in spans})
    t_min = min(s[4] for s in spans)
    rows = len(ranks) * len(TRACKS)
    fig, ax = plt.subplots(figsize=(width, 0.32 * rows + 1.6))
    yticks, ylabels = [], []
    for i, r in enumerate(ranks):
        for j, track in enumerate(TRACKS):
            y = rows - 1 - (i * len(TRACKS) + j)
            yticks.append(y)
            ylabels.append(f"{labels.get(r, f'rank {r}').split(':')[0]} {track}")
            mine = [s for s in spans if s[0] == r and s[1] == j]
            ax.broken_barh([(s[4] - t_min, s[5] - s[4]) for s in mine], (y - 0.4, 0.8),
                           facecolors=[colour(s[2]) for s in mine], edgecolor="none")
            span_ms = max(s[5] for s in spans) - t_min
            for s in mine:
                if s[3] >= 0 and (s[5] - s[4]) > span_ms / 120:
                    ax.text((s[4] + s[5]) / 2 - t_min, y, str(s[3]), ha="center", va="center", fontsize=6)
        if i:
            ax.axhline(rows - i * len(TRACKS) - 0.5, color="black", linewidth=0.6)
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels, fontsize=7)
    ax.set_xlabel("ms from the start of the run")
    default = (f"lfm2-rank: {meta.get('ranks', len(ranks))} ranks, {meta.get('sequences', '?')} x "
               f"{meta.get('seq_len', '?')} tokens, {meta.get('microbatches', '?')} microbatches of "
               f"{meta.get('microbatch', '?')}, {meta.get('dtype', '')}")
    ax.set_title(title or default, fontsize=9)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], fontsize=7, ncol=len(COLOURS),
              loc="upper center", bbox_to_anchor=(0.5, -0.12 - 2.0 / rows), frameon=False)
    fig.tight_layout()
    with atomic_output(out_path, "png", inputs=[meta.get("_path")]) as tmp:
        fig.savefig(tmp, dpi=120, format="png")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="JSON written by lfm2-rank --trace")
    ap.add_argument("png", help="the picture to write")
    ap.add_argument("--title", default="")
    ap.add_argument("--width", type=float, default=14.0, help="inches")
    args = ap.parse_args(argv)
    if not (math.isfinite(args.width) and 1 <= args.width <= 200):
        raise ToolError(f"--width {args.width:g}: not a width in inches in [1, 200]")
    output_target(args.png, "png", inputs=[args.trace])  # before the work
    meta, labels, spans = load(args.trace)
    meta["_path"] = args.trace
    for line in summary(labels, spans):
        print(f"trace_gantt: {line}")
    draw(meta, labels, spans, args.png, args.title, args.width)
    print(f"trace_gantt: wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(run(TOOL, main, sys.argv[1:]))
