"""Chat templates rendered exactly as transformers' apply_chat_template renders them
(transformers/utils/chat_template_utils.py, 5.x): the same jinja2 environment
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls, the `generation` block
tag), filters (tojson as json.dumps, ensure_ascii off) and globals (raise_exception,
strftime_now, dict, namespace without underscore names), and the same variables: messages with
their None-valued keys dropped and reasoning aliased (reasoning_content / thinking / reasoning),
tools, documents=None, add_generation_prompt, and the named special tokens. The rendered text is
then encoded without adding special tokens (the template writes them), as transformers does."""
import json
from datetime import datetime

from tool_cli import need

TOOL = "lfm2_text"
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class TemplateRefused(Exception):
    """The template called raise_exception(message)."""


def _environment():
    jinja2 = need(TOOL, "jinja2")
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """{% generation %}...{% endgeneration %}: renders its body (transformers tracks where the
        assistant's tokens are only when asked for a mask)."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with an underscore")

    def raise_exception(message):
        raise TemplateRefused(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def compile_template(source):
    """A compiled template; jinja2.TemplateSyntaxError (with its lineno) for a broken one."""
    return _environment().from_string(source)


def plain_messages(messages):
    """The messages as transformers hands them to the template: keys whose value is None dropped,
    and a message's reasoning under both `thinking` and `reasoning_content`."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def render(compiled, messages, tools, special_tokens):
    """The prompt text for `messages` (and `tools`), with the generation prompt."""
    return compiled.render(messages=plain_messages(messages), tools=tools, documents=None, add_generation_prompt=True,
                           **special_tokens)
