"""Requests of a prompts file (JSONL): one JSON object a line, the field names of the OpenAI / vLLM
request. Exactly one of
    "prompt": "text"                      encoded as tokenizer(text) is (special tokens added by the
                                          tokenizer's post-processor, e.g. a BOS)
    "messages": [{"role", "content"}...]  the model's chat template applied, generation prompt added
    "input_ids": [1, 2, 3]                taken as they are
and optionally "id" (a string or an integer; default: the request's index), "max_tokens" (1..2^30),
"temperature" (>= 0), "top_p" (in (0, 1]), "top_k" (0..2^30; 0 and -1: all tokens), "seed"
(0..2^63-1), "stop" (a string or a list of non-empty strings) and, with "messages", "tools" (a list
passed to the template). Roles: system, user, assistant, tool. Blank lines are skipped. Every
problem is a ToolError naming the file, the line and the field."""
import json
import math

from tool_cli import ToolError

ROLES = ("system", "user", "assistant", "tool")
SOURCES = ("prompt", "messages", "input_ids")
PARAMS = ("max_tokens", "temperature", "top_p", "top_k", "seed")
FIELDS = SOURCES + PARAMS + ("id", "stop", "tools")
MAX_TOKENS = 1 << 30
MAX_SEED = (1 << 63) - 1


class Request:
    """One line of the prompts file, checked."""

    def __init__(self, index, line):
        self.index, self.line = index, line
        self.id = str(index)
        self.kind = None        # "prompt", "messages" or "input_ids"
        self.source = None      # the field's value
        self.tools = None
        self.params = {}        # max_tokens, temperature, top_p, top_k, seed: given ones only
        self.stop = []


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _check_param(where, name, v):
    if name == "max_tokens":
        if not _is_int(v) or not 1 <= v <= MAX_TOKENS:
            raise ToolError(f"{where}: max_tokens {json.dumps(v)} is not a whole number in [1, {MAX_TOKENS}]")
    elif name == "temperature":
        if not _is_number(v) or v < 0:
            raise ToolError(f"{where}: temperature {json.dumps(v)} is not a finite number >= 0")
    elif name == "top_p":
        if not _is_number(v) or not 0 < v <= 1:
            raise ToolError(f"{where}: top_p {json.dumps(v)} is not a number in (0, 1]")
    elif name == "top_k":
        if not _is_int(v) or not -1 <= v <= MAX_TOKENS:
            raise ToolError(f"{where}: top_k {json.dumps(v)} is not a whole number in [-1, {MAX_TOKENS}] (0 and -1: all)")
        v = max(v, 0)
    elif name == "seed":
        if not _is_int(v) or not 0 <= v <= MAX_SEED:
            raise ToolError(f"{where}: seed {json.dumps(v)} is not a whole number in [0, 2^63 - 1]")
    return v


def _check_messages(where, messages):
    if not isinstance(messages, list) or not messages:
        raise ToolError(f"{where}: messages is not a non-empty list")
    for i, m in enumerate(messages):
        at = f"{where}: messages[{i}]"
        if not isinstance(m, dict):
            raise ToolError(f"{at} is not an object with role and content")
        role = m.get("role")
        if not isinstance(role, str):
            raise ToolError(f"{at} has no role")
        if role not in ROLES:
            raise ToolError(f"{at}.role '{role}' is not a known role ({', '.join(ROLES[:-1])} or {ROLES[-1]})")
        content = m.get("content")
        if content is None and not m.get("tool_calls"):
            raise ToolError(f"{at} has no content")
        if content is not None and not isinstance(content, (str, list, dict)):
            raise ToolError(f"{at}.content is neither text nor a list of parts")


def _check_stop(where, stop):
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ToolError(f"{where}: stop is neither a non-empty string nor a list of them")
    return stops


def parse_line(where, index, line_no, obj):
    """One request from a decoded JSON value."""
    if not isinstance(obj, dict):
        raise ToolError(f"{where}: a request is a JSON object, not {type(obj).__name__}")
    unknown = [k for k in obj if k not in FIELDS]
    if unknown:
        raise ToolError(f"{where}: unknown field '{unknown[0]}' (known: {', '.join(FIELDS)})")
    given = [k for k in SOURCES if k in obj]
    if len(given) != 1:
        raise ToolError(f"{where}: needs exactly one of prompt, messages or input_ids" +
                        (f" (has {' and '.join(given)})" if given else ""))
    r = Request(index, line_no)
    r.kind, r.source = given[0], obj[given[0]]
    if r.kind == "prompt" and not isinstance(r.source, str):
        raise ToolError(f"{where}: prompt is not a string")
    if r.kind == "messages":
        _check_messages(where, r.source)
    if r.kind == "input_ids" and (not isinstance(r.source, list) or not r.source or
                                  not all(_is_int(t) for t in r.source)):
        raise ToolError(f"{where}: input_ids is not a non-empty list of whole numbers")
    if "tools" in obj:
        if r.kind != "messages" or not isinstance(obj["tools"], list):
            raise ToolError(f"{where}: tools is a list, given with messages")
        r.tools = obj["tools"]
    if "id" in obj:
        if not (isinstance(obj["id"], str) and obj["id"]) and not _is_int(obj["id"]):
            raise ToolError(f"{where}: id is neither a non-empty string nor a whole number")
        r.id = str(obj["id"])
    for name in PARAMS:
        if name in obj:
            r.params[name] = _check_param(where, name, obj[name])
    if "stop" in obj:
        r.stop = _check_stop(where, obj["stop"])
    return r


def read_requests(path):
    """Every request of a JSONL file, in order; ids unique."""
    requests, seen = [], {}
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            where = f"{path} line {line_no}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ToolError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise ToolError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
            r = parse_line(where, len(requests), line_no, obj)
            if r.id in seen:
                raise ToolError(f"{where}: id '{r.id}' is also the id of line {seen[r.id]}")
            seen[r.id] = line_no
            requests.append(r)
    if not requests:
        raise ToolError(f"{path}: no requests (one JSON object a line)")
    return requests
