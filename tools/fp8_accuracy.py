"""FP8 against bf16 (docs/fp8.md): the next-token logits of two lfm2-rank outputs of the same inputs,
one run on the bf16 model and one on its FP8 file (`h5pack quantize`), compared row by row.

  fp8_accuracy.py REF.h5 FP8.h5 [--all-logits] [--json OUT.json]

Per row (the `logits` [N, V] of each sequence's last position, or with --all-logits every position of
`all_logits` [N, S, V]): the relative logit error max|d| / max|ref|, the top-1 agreement, and the
KL divergence KL(softmax(ref) || softmax(fp8)) in nats; printed as max and mean over the rows (and
written as JSON with --json). Needs h5py and numpy."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tool_cli import ToolError, atomic_output, check_input, need, run  # noqa: E402

TOOL = "fp8_accuracy"
ROWS = 256  # rows compared at a time (256 x 65,536 fp32 logits = 64 MiB a side)


def read_rows(h5, path, name, key):
    if key not in h5:
        raise ToolError(f"{name} {path}: no dataset '{key}' (run lfm2-rank with --output"
                        f"{' and --all-logits' if key == 'all_logits' else ''})")
    d = h5[key]
    if d.ndim not in (2, 3):
        raise ToolError(f"{name} {path}: '{key}' has {d.ndim} dimensions")
    return d


def compare(ref, got, np):
    """Metrics of one block of rows [n, V] (float64 sums)."""
    ref = ref.astype(np.float64)
    got = got.astype(np.float64)
    if not (np.isfinite(ref).all() and np.isfinite(got).all()):
        raise ToolError("a logit is NaN or infinite")
    rel = np.abs(got - ref).max(axis=1) / np.maximum(np.abs(ref).max(axis=1), 1e-30)
    top1 = ref.argmax(axis=1) == got.argmax(axis=1)
    lp = ref - ref.max(axis=1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(axis=1, keepdims=True))
    lq = got - got.max(axis=1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(axis=1, keepdims=True))
    kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
    return rel, top1, kl


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref", metavar="REF.h5", help="lfm2-rank output of the bf16 (reference) model")
    ap.add_argument("fp8", metavar="FP8.h5", help="lfm2-rank output of the FP8 model on the same inputs")
    ap.add_argument("--all-logits", action="store_true", help="compare every position (all_logits)")
    ap.add_argument("--json", metavar="OUT.json", help="also write the figures as JSON")
    a = ap.parse_args(argv)
    check_input(a.ref, "reference")
    check_input(a.fp8, "fp8 output")
    h5py = need(TOOL, "h5py")
    np = need(TOOL, "numpy")
    key = "all_logits" if a.all_logits else "logits"
    with h5py.File(a.ref, "r") as fr, h5py.File(a.fp8, "r") as ff:
        r, f = read_rows(fr, a.ref, "reference", key), read_rows(ff, a.fp8, "fp8 output", key)
        if r.shape != f.shape:
            raise ToolError(f"'{key}' is {tuple(r.shape)} in {a.ref} but {tuple(f.shape)} in {a.fp8} (the same "
                            "inputs, please)")
        vocab = r.shape[-1]
        n = int(np.prod(r.shape[:-1]))
        rels, top1s, kls = [], [], []
        # blocks of rows: of `logits` [N, V], or one sequence's positions of `all_logits` [N, S, V]
        blocks = ((i, i + 1) for i in range(r.shape[0])) if r.ndim == 3 else \
            ((b, min(n, b + ROWS)) for b in range(0, n, ROWS))
        for b, e in blocks:
            rb, fb = r[b:e].reshape(-1, vocab), f[b:e].reshape(-1, vocab)
            rel, top1, kl = compare(rb, fb, np)
            rels.append(rel), top1s.append(top1), kls.append(kl)
    rel, top1, kl = np.concatenate(rels), np.concatenate(top1s), np.concatenate(kls)
    out = {"rows": n, "vocab": vocab, "rel_logit_error_max": float(rel.max()), "rel_logit_error_mean": float(rel.mean()),
           "top1_agreement": float(top1.mean()), "kl_mean": float(kl.mean()), "kl_max": float(kl.max())}
    print(f"{n} rows x {vocab} logits: relative logit error max {out['rel_logit_error_max']:.4g}, mean "
          f"{out['rel_logit_error_mean']:.4g}; top-1 agreement {100 * out['top1_agreement']:.2f} %; KL mean "
          f"{out['kl_mean']:.3g}, max {out['kl_max']:.3g} nats")
    if a.json:
        with atomic_output(a.json, "--json", inputs=(a.ref, a.fp8)) as tmp:
            with open(tmp, "w") as fh:
                json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(run(TOOL, main, sys.argv[1:]))
