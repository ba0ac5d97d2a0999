"""Token ids to text as they arrive, and the rules that end a completion.

Incremental detokenization (as vLLM and transformers' TextStreamer do it): each new token decodes a
short window of the latest tokens, and the text that window adds past the previous window's is
new, unless it ends in U+FFFD (a character whose bytes have not all arrived). Text is held back
while its end could still become a stop string, or one of the patterns that
clean_up_tokenization_spaces rewrites. A completion stops at the first stop string to appear as
the text grows token by token (its text ends just before it; its tokens run to the one that
completed it), or at an EOS id (kept in the tokens; a special token, so no text). When it ends, the
rest is given: the whole decode of its tokens when no stop string ended it, so that the pieces add
up to exactly what `tokenizer.decode(ids, skip_special_tokens=True)` gives."""

CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
           (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def clean_up_spaces(text):
    """transformers' clean_up_tokenization."""
    for a, b in CLEANUP:
        text = text.replace(a, b)
    return text


def _held_back(text, patterns):
    """Length of the longest end of `text` that is a proper prefix of one of `patterns`."""
    best = 0
    for p in patterns:
        for n in range(min(len(p) - 1, len(text)), best, -1):
            if text.endswith(p[:n]):
                best = n
                break
    return best


class Completion:
    """One sequence's tokens, text and end. push() returns the text that became final."""

    def __init__(self, tokenizer, eos_ids=(), stop=(), max_tokens=None, clean_up=False):
        self.tok, self.eos, self.stop = tokenizer, set(eos_ids), list(stop)
        self.max_tokens, self.clean_up = max_tokens, clean_up
        self.ids, self.raw, self.emitted = [], "", 0
        self.prefix_offset = self.read_offset = 0
        self.finish_reason = None   # "stop" or "length" once ended
        self.stop_at = None         # where a stop string cut the text

    def _decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=True)

    def _view(self):
        return clean_up_spaces(self.raw) if self.clean_up else self.raw

    def push(self, token):
        """Adds one token; returns the new final text ("" while held back or after the end)."""
        if self.finish_reason is not None:
            return ""
        self.ids.append(int(token))
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new = self._decode(self.ids[self.prefix_offset:])
        if len(new) > len(prefix) and not new.endswith("\ufffd"):
            self.raw += new[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        view = self._view()
        if self.stop and self._find_stop(view):
            return self.finish("stop")
        if int(token) in self.eos:
            return self.finish("stop")
        if self.max_tokens is not None and len(self.ids) >= self.max_tokens:
            return self.finish("length")
        hold = _held_back(view, self.stop + ([a for a, _ in CLEANUP] if self.clean_up else []))
        return self._emit(view[:len(view) - hold])

    def _find_stop(self, view):
        """The stop string that appeared first; its start in the text."""
        first = None
        for s in self.stop:
            at = view.find(s, max(0, self.emitted - len(s)))
            if at >= 0 and (first is None or at + len(s) < first[0] + first[1] or
                            (at + len(s) == first[0] + first[1] and at < first[0])):
                first = (at, len(s))
        if first is not None:
            self.stop_at = first[0]
        return first is not None

    def _emit(self, text):
        piece = text[self.emitted:]
        self.emitted = max(self.emitted, len(text))
        return piece

    def text(self):
        """The completion's text: up to the stop string, else the whole decode."""
        if self.stop_at is not None:
            return self._view()[:self.stop_at]
        whole = self._decode(self.ids)
        return clean_up_spaces(whole) if self.clean_up else whole

    def finish(self, reason="length"):
        """Ends the completion (if it has not ended); returns the rest of its text."""
        if self.finish_reason is None:
            self.finish_reason = reason
            text = self.text()
            return text[self.emitted:] if len(text) >= self.emitted else ""
        return ""


def complete(tokenizer, ids, eos_ids=(), stop=(), max_tokens=None, clean_up=False):
    """A finished sequence at once: (text, the ids it keeps, finish_reason). The ids end at the first
    EOS (kept) or at max_tokens; a stop string cuts them at the token that completed it."""
    ids = [int(t) for t in ids[:max_tokens]]
    eos = set(eos_ids)
    end = next((i + 1 for i, t in enumerate(ids) if t in eos), None)
    if end is not None:
        ids = ids[:end]
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    view = clean_up_spaces(whole) if clean_up else whole
    if stop and any(s in view for s in stop):  # only then is the token-by-token walk needed
        c = Completion(tokenizer, eos, stop, max_tokens, clean_up)
        for t in ids:
            c.push(t)
        if c.finish_reason == "stop":
            return c.text(), c.ids, "stop"
    return view, ids, "stop" if end is not None else "length"
