"""The HDF5 files between the front end and lfm2-rank (docs/text.md, "The inputs file").

The inputs file `encode` writes, N requests in input order:
    input_ids       int32 (N, S)   prompts, right-padded with 0
    lengths         int32 (N)      prompt lengths
    max_new_tokens  int32 (N)      per request; -1: the run's --max-new-tokens
    temperature     float32 (N)    per request; -1: the run's --temperature
    top_p           float32 (N)    per request; -1: the run's --top-p
    top_k           int32 (N)      per request (0: all tokens); -1: the run's --top-k
    seed            int64 (N)      per request; -1: the run's --seed
    request_id      UTF-8 strings (N)
    stop            UTF-8 strings (N): each a JSON list of the request's stop strings
  root attributes: format "lfm2-rank-inputs", per_sequence_default -1, model_fingerprint and
  text_fingerprint of the model whose tokenizer made the ids.
The outputs file is lfm2-rank's: generated int32 (N, K), n_generated int32 (N)."""
import json

from tool_cli import ToolError, atomic_output, need, open_h5

TOOL = "lfm2_text"
DEFAULT = -1  # a per-request field that was not given: the run's flag decides
PER_SEQUENCE = (("max_new_tokens", "max_tokens", "int32"), ("temperature", "temperature", "float32"),
                ("top_p", "top_p", "float32"), ("top_k", "top_k", "int32"), ("seed", "seed", "int64"))


def write_inputs(path, rows, requests, model, inputs=()):
    """Writes the inputs file atomically (nothing is left on an error)."""
    h5py, np = need(TOOL, "h5py"), need(TOOL, "numpy")
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    text = h5py.string_dtype("utf-8")
    with atomic_output(path, "inputs", inputs) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("input_ids", data=ids)
        f.create_dataset("lengths", data=np.array([len(r) for r in rows], dtype=np.int32))
        for name, field, dtype in PER_SEQUENCE:
            values = [r.params.get(field, DEFAULT) for r in requests]
            f.create_dataset(name, data=np.array(values, dtype=dtype))
        f.create_dataset("request_id", data=[r.id for r in requests], dtype=text)
        f.create_dataset("stop", data=[json.dumps(r.stop, ensure_ascii=False) for r in requests], dtype=text)
        f.attrs["format"] = "lfm2-rank-inputs"
        f.attrs["per_sequence_default"] = DEFAULT
        f.attrs["model_fingerprint"] = model.model_fingerprint
        f.attrs["text_fingerprint"] = model.text_fingerprint
    return ids.shape


class RequestInfo:
    """What decoding needs of the requests: ids, prompt lengths, stop strings, max tokens."""

    def __init__(self, path):
        self.path = path
        with open_h5(TOOL, path, "inputs") as f:
            missing = [d for d in ("lengths", "request_id", "stop", "max_new_tokens") if d not in f]
            if missing:
                raise ToolError(f"inputs {path}: has no {missing[0]} (not written by lfm2_text.py encode)")
            self.lengths = [int(n) for n in f["lengths"][()]]
            self.ids = [s for s in f["request_id"].asstr()[()]]
            self.stops = [json.loads(s) for s in f["stop"].asstr()[()]]
            self.max_tokens = [int(n) if n > 0 else None for n in f["max_new_tokens"][()]]
            self.text_fingerprint = str(f.attrs.get("text_fingerprint", ""))
        if not len(self.lengths) == len(self.ids) == len(self.stops) == len(self.max_tokens):
            raise ToolError(f"inputs {path}: lengths, request_id, stop and max_new_tokens differ in length")


def read_outputs(path):
    """(each sequence's generated ids, up to n_generated; the eos ids the run recorded, or None)."""
    with open_h5(TOOL, path, "outputs") as f:
        if "generated" not in f:
            raise ToolError(f"outputs {path}: no generated tokens (run lfm2-rank with --max-new-tokens)")
        gen = f["generated"][()]
        if gen.ndim != 2:
            raise ToolError(f"outputs {path}: generated is not (N, K)")
        n = f["n_generated"][()] if "n_generated" in f else [gen.shape[1]] * gen.shape[0]
        if len(n) != gen.shape[0] or any(not 0 <= int(k) <= gen.shape[1] for k in n):
            raise ToolError(f"outputs {path}: n_generated does not fit generated {gen.shape}")
        eos = f.attrs.get("eos")
    rows = [[int(t) for t in gen[i, :int(n[i])]] for i in range(gen.shape[0])]
    return rows, _eos_attr(eos, path)


def _eos_attr(eos, path):
    """The run's EOS ids: lfm2-rank writes a JSON list ("[]": the run stopped at none)."""
    if eos is None:
        return None
    if isinstance(eos, bytes):
        eos = eos.decode("utf-8", "replace")
    if isinstance(eos, str):
        try:
            eos = json.loads(eos)
        except json.JSONDecodeError:
            raise ToolError(f"outputs {path}: attribute eos '{eos}' is not a list of ids") from None
    ids = eos if hasattr(eos, "__len__") else [eos]
    if not all(isinstance(e, int) or hasattr(e, "dtype") for e in ids):
        raise ToolError(f"outputs {path}: attribute eos {eos!r} is not a list of ids")
    return [int(e) for e in ids]
