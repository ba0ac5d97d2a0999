"""The text side of a weight file (docs/weight-format.md, "The text side"), read with h5py and
made into what transformers would build from the same files of a checkpoint directory:

- the tokenizer: tokenizer.json through `tokenizers`, with transformers' generic tokenizer class
  (PreTrainedTokenizerFast / TokenizersBackend, LFM2's) applied on top: no truncation or padding,
  `split_special_tokens` from tokenizer_config.json, and any named special token or
  `added_tokens_decoder` entry that tokenizer.json lacks added as a special token;
- the chat template: chat_template.jinja when present, else tokenizer_config.json's entry (a
  string, or named templates: "tool_use" when tools are given and it exists, else "default");
- the template's variables: the named special tokens (bos_token, eos_token, unk_token, sep_token,
  pad_token, cls_token, mask_token and tokenizer_config's extra_special_tokens names), from
  tokenizer_config.json, or from special_tokens_map.json where the config has no
  added_tokens_decoder (transformers' legacy path);
- the EOS ids: generation_config.json's eos_token_id, else the tokenizer's eos_token;
- decoding: skip_special_tokens, and clean_up_tokenization_spaces only where transformers applies it
  (not for BPE, unless the config insists)."""
import json

from tool_cli import ToolError, need, open_h5

TOOL = "lfm2_text"
NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
GENERIC_CLASSES = (None, "PreTrainedTokenizerFast", "TokenizersBackend")


def _token_text(value):
    """A special token of tokenizer_config.json: a string or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class ModelText:
    """What a weight file carries besides its weights: config, fingerprints and text files."""

    def __init__(self, path):
        self.path = path
        with open_h5(TOOL, path, "model") as f:
            if f.attrs.get("format") != "lfm2-rank-weights":
                raise ToolError(f"model {path}: not an lfm2-rank weight file (no format attribute 'lfm2-rank-weights')")
            self.config = json.loads(f.attrs["config_json"])
            self.vocab_size = int(self.config["vocab_size"])
            self.max_positions = int(self.config.get("max_position_embeddings", 0)) or None
            self.model_fingerprint = str(f.attrs.get("model_fingerprint", ""))
            self.text_fingerprint = str(f.attrs.get("text_fingerprint", ""))
            group = f.get("text")
            self.files = {name: group[name][()].tobytes() for name in group} if group is not None else {}
        self._tokenizer = None

    def json_file(self, name):
        """A JSON file of the text side as a dict ({} when absent)."""
        if name not in self.files:
            return {}
        try:
            obj = json.loads(self.files[name].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ToolError(f"model {self.path}: text/{name} is not JSON ({e})") from None
        if not isinstance(obj, dict):
            raise ToolError(f"model {self.path}: text/{name} is not a JSON object")
        return obj

    def has_tokenizer(self):
        return "tokenizer.json" in self.files

    def tokenizer(self):
        """The tokenizers.Tokenizer transformers would use (see the module's docstring)."""
        if self._tokenizer is not None:
            return self._tokenizer
        if not self.has_tokenizer():
            raise ToolError(f"model {self.path}: carries no tokenizer (text/tokenizer.json); convert the checkpoint "
                            f"with its tokenizer files (h5pack convert DIR OUT.h5), or give input_ids")
        tk = need(TOOL, "tokenizers")
        try:
            tok = tk.Tokenizer.from_str(self.files["tokenizer.json"].decode("utf-8"))
        except Exception as e:
            raise ToolError(f"model {self.path}: text/tokenizer.json does not load ({e})") from None
        cfg = self.json_file("tokenizer_config.json")
        tok.no_truncation()
        tok.no_padding()
        tok.encode_special_tokens = bool(cfg.get("split_special_tokens", False))
        self._add_missing_specials(tok, cfg, tk)
        self._tokenizer = tok
        return tok

    def _add_missing_specials(self, tok, cfg, tk):
        """transformers adds the named special tokens and added_tokens_decoder entries that the
        tokenizer's added tokens lack, as special tokens (in id order, then the named ones)."""
        have = {t.content for t in tok.get_added_tokens_decoder().values()}
        wanted = []
        decoder = cfg.get("added_tokens_decoder") or {}
        for _, entry in sorted(decoder.items(), key=lambda kv: int(kv[0])):
            if isinstance(entry, dict) and entry.get("content") not in have:
                args = {k: entry[k] for k in ("single_word", "lstrip", "rstrip", "normalized", "special") if k in entry}
                wanted.append(tk.AddedToken(entry["content"], **args))
        named = [t for t in self.special_tokens().values() if t not in have]
        extra = cfg.get("extra_special_tokens")
        named += [_token_text(t) for t in (extra if isinstance(extra, list) else []) if _token_text(t) not in have]
        wanted += [tk.AddedToken(t, special=True) for t in named if t not in [w.content for w in wanted]]
        if wanted:
            tok.add_tokens(wanted)

    def special_tokens(self):
        """The named special tokens the chat template sees (transformers' special_tokens_map)."""
        cfg = self.json_file("tokenizer_config.json")
        values = {k: cfg.get(k) for k in NAMED_SPECIAL}
        extra = cfg.get("extra_special_tokens")
        if isinstance(extra, dict):
            values.update(extra)
        if "added_tokens_decoder" not in cfg:  # transformers' legacy path reads special_tokens_map.json
            for k, v in self.json_file("special_tokens_map.json").items():
                if k in NAMED_SPECIAL:
                    values[k] = v
        return {k: _token_text(v) for k, v in values.items() if _token_text(v) is not None}

    def chat_template(self, tools=None):
        """The template apply_chat_template would use, or None."""
        cfg = self.json_file("tokenizer_config.json")
        if "chat_template.jinja" in self.files:
            return self.files["chat_template.jinja"].decode("utf-8")
        t = cfg.get("chat_template")
        if isinstance(t, list):
            named = {e.get("name"): e.get("template") for e in t if isinstance(e, dict)}
            if tools is not None and "tool_use" in named:
                return named["tool_use"]
            if "default" not in named:
                raise ToolError(f"model {self.path}: the chat templates {sorted(named)} include no 'default'")
            return named["default"]
        return t if isinstance(t, str) else None

    def tokenizer_class_note(self):
        """A warning when transformers would build the tokenizer with a class of its own."""
        cls = self.json_file("tokenizer_config.json").get("tokenizer_class")
        if cls in GENERIC_CLASSES:
            return None
        return (f"tokenizer_class {cls}: transformers may build it with code of its own; this front end uses "
                f"tokenizer.json as transformers' generic class does")

    def eos_ids(self):
        """generation_config.json's eos_token_id, else the tokenizer's eos_token, else []."""
        eos = self.json_file("generation_config.json").get("eos_token_id")
        if eos is not None:
            return [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        name = self.special_tokens().get("eos_token")
        if name and self.has_tokenizer():
            i = self.tokenizer().token_to_id(name)
            return [i] if i is not None else []
        return []

    def cleans_up_spaces(self):
        """transformers' clean_up_tokenization_spaces as its decode applies it (never for BPE unless
        clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output)."""
        cfg = self.json_file("tokenizer_config.json")
        if not cfg.get("clean_up_tokenization_spaces", False):
            return False
        model_type = json.loads(self.files["tokenizer.json"]).get("model", {}).get("type")
        return model_type != "BPE" or bool(cfg.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"))

    def tokenizer_vocab(self):
        """Ids the tokenizer knows: [0, n)."""
        return self.tokenizer().get_vocab_size(with_added_tokens=True)
