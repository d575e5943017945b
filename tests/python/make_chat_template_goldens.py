"""Writes tests/fixtures/chat_templates/goldens.json: what transformers'
apply_chat_template renders for the real chat templates in that folder (and
for small templates that exercise one Jinja feature each), over several
conversations, for tests/test_chat_template.cpp.

    .venv/bin/python tests/python/make_chat_template_goldens.py   (from the repository root)

The template environment is transformers' own (4.46's
transformers.utils.chat_template_utils._compile_jinja_template: jinja2's
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols,
raise_exception, strftime_now and its json.dumps tojson), called with the
keyword arguments apply_chat_template passes (messages, tools, documents,
add_generation_prompt, then the special tokens and extra variables).

Every dict is given to jinja2 with its keys sorted, because redco's io::Json
keeps object keys sorted: a template that iterates a message or prints a tool
with tojson then sees the same order on both sides. A case whose template
calls raise_exception records the message ("exception"); one that fails
otherwise records the Python exception's type ("error"). strftime_now is left
out (its output is the date); Llama 3.1's template has its own fixed
date_string default, and one case passes date_string explicitly.
"""

import json
import os
import sys

import jinja2
from transformers.utils.chat_template_utils import _compile_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "chat_templates")

SYSTEM_USER = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
]
MULTI_TURN = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "What is 2+2?"},
]
SYSTEM_MULTI_TURN = [{"role": "system", "content": "Be brief."}] + MULTI_TURN
SINGLE_USER = [{"role": "user", "content": "Tell me a joke."}]
UNICODE = [
    {"role": "system", "content": "Réponds en français 🙂"},
    {"role": "user", "content": "  Quotes: \"double\" and 'single', back\\slash,\nnew line\tand tab  "},
    {"role": "assistant", "content": "  Ça va — très bien! 日本語  "},
    {"role": "user", "content": "Ñandú?\n"},
]
ENDS_WITH_ASSISTANT = [
    {"role": "user", "content": "Say hi."},
    {"role": "assistant", "content": "Hi!"},
]
NOT_ALTERNATING = [
    {"role": "user", "content": "a"},
    {"role": "user", "content": "b"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]
TOOL_CALL = {
    "id": "call12345",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
}
TOOL_CHAT = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
    {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
     "content": "{\"temperature\": 18, \"sky\": \"clear\"}"},
    {"role": "assistant", "content": "It is 18 °C and clear in Paris."},
    {"role": "user", "content": "Thanks!"},
]

CHATS = {
    "system_user": SYSTEM_USER,
    "multi_turn": MULTI_TURN,
    "system_multi_turn": SYSTEM_MULTI_TURN,
    "single_user": SINGLE_USER,
    "unicode": UNICODE,
    "ends_with_assistant": ENDS_WITH_ASSISTANT,
    "not_alternating": NOT_ALTERNATING,
}

LLAMA_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
LLAMA3_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
QWEN_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

# fixture name -> (special tokens, extra cases: (name, messages, extra variables))
TEMPLATES = {
    "llama-2-chat": (LLAMA_TOKENS, []),
    "llama-3-instruct": (LLAMA3_TOKENS, []),
    "llama-3.1-instruct": (LLAMA3_TOKENS, [
        ("tools", TOOL_CHAT, {"tools": TOOLS}),
        ("tools_in_system", TOOL_CHAT, {"tools": TOOLS, "tools_in_user_message": False}),
        ("date_string", SYSTEM_USER, {"date_string": "06 Dec 2025"}),
        ("builtin_tools", SYSTEM_USER, {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}),
        ("tools_without_user", [{"role": "system", "content": "s"}], {"tools": TOOLS}),
        ("two_tool_calls", [{"role": "user", "content": "q"},
                            {"role": "assistant", "tool_calls": [TOOL_CALL, TOOL_CALL]}], {}),
    ]),
    "mistral-7b-instruct-v0.1": (LLAMA_TOKENS, []),
    "mistral-7b-instruct-v0.3": (LLAMA_TOKENS, [
        ("tools", TOOL_CHAT, {"tools": TOOLS}),
        ("bad_tool_call_id", [{"role": "user", "content": "q"},
                              {"role": "assistant", "tool_calls": [dict(TOOL_CALL, id="c1")]}], {}),
        ("tool_result_mapping", [{"role": "user", "content": "q"},
                                 {"role": "assistant", "tool_calls": [TOOL_CALL]},
                                 {"role": "tool", "tool_call_id": "call12345",
                                  "content": {"temperature": 18, "sky": "clear", "ok": True, "note": None,
                                              "quote": "it's"}}], {}),
    ]),
    "qwen2-instruct": (QWEN_TOKENS, []),
    "qwen2.5-instruct": (QWEN_TOKENS, [
        ("tools", TOOL_CHAT, {"tools": TOOLS}),
        ("tools_no_system", TOOL_CHAT[1:], {"tools": TOOLS}),
        ("string_arguments", [{"role": "user", "content": "q"},
                              {"role": "assistant", "content": "Let me check.",
                               "tool_calls": [{"function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
                              {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}], {}),
    ]),
    "tinyllama-chat": (LLAMA_TOKENS, []),
    "chatml": ({"eos_token": "<|im_end|>"}, []),
}

# Small templates, one Jinja feature each: (name, source, variables).
FEATURES = [
    ("trim_blocks", "{% if true %}\nx\n{% endif %}\ny", {}),
    ("lstrip_blocks", "a\n    {% if true %}\n    b\n    {% endif %}\nc", {}),
    ("lstrip_not_after_text", "x {% if true %}\n  y\n{% endif %}z", {}),
    ("lstrip_comment", "a\n  {# note #}\nb", {}),
    ("minus_trims", "a   {{- 'b' -}}   c  {%- if true -%}  d  {%- endif %}  e", {}),
    ("plus_keeps", "a\n  {%+ if true %}b{% endif +%}\nc", {}),
    ("output_keeps_newline", "{{ 'a' }}\n{{ 'b' }}\n", {}),
    ("trailing_newlines", "x\n\n", {}),
    ("crlf", "{% if true %}\r\na\r\n{% endif %}\r\nb", {}),
    ("minus_comment", "a  {#- c -#}  b", {}),
    ("var_minus_newlines", "a\n\n{{- 'b' }}\n\n{{ 'c' -}}\n\nd", {}),
    ("loop_vars", "{% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
                  "{{ loop.length }}{{ loop.revindex }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}",
     {"items": ["a", "b", "c"]}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1] %}{{ x }}{% else %}e{% endfor %}", {}),
    ("for_filter", "{% for x in [1, 2, 3, 4, 5] if x is odd %}{{ x }}/{{ loop.length }}{% endfor %}", {}),
    ("break_continue", "{% for n in [1, 2, 3, 4] %}{% if n == 2 %}{% continue %}{% endif %}"
                       "{% if n == 4 %}{% break %}{% endif %}{{ n }}{% endfor %}", {}),
    ("loop_scope", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}"
                   "{% if true %}{% set y = 3 %}{% endif %}{{ y }}", {}),
    ("unpack_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}"
                     "{% for k, v in d | items %}{{ k }}{% endfor %}", {"d": {"x": 1, "y": "z"}}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}"
                     "{{ loop.index }}|{% endfor %}", {}),
    ("namespace", "{% set ns = namespace(total=0, seen=false) %}{% for x in [1, 2, 3] %}"
                  "{% set ns.total = ns.total + x %}{% if x == 2 %}{% set ns.seen = true %}{% endif %}"
                  "{% endfor %}{{ ns.total }} {{ ns.seen }} {{ ns }}", {}),
    ("set_block", "{% set s %}a{{ 1 + 1 }}b{% endset %}[{{ s }}]", {}),
    ("macro", "{% macro m(a, b=2, c='x') %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}"
              "{{ m(1) }}{{ m(1, 3) }}{{ m(1, c='y') }}{{ m() }}", {}),
    ("arithmetic", "{{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 * 3 - 1 }} "
                   "{{ -4 }} {{ 1.5 + 1 }} {{ 3 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 7.5 // 2 }} "
                   "{{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 123456789.0 * 1000 }} "
                   "{{ 'ab' * 3 }} {{ [1] + [2] }}", {}),
    ("concat", "{{ 'n=' ~ 3 ~ none ~ true ~ missing ~ 1.0 }}", {}),
    ("comparisons", "{{ 1 < 2 }}{{ 2 <= 1 }}{{ 'a' == 'a' }}{{ 'a' != 'a' }}{{ 3 > 2 }}{{ 1 >= 1 }}"
                    "{{ 1 < 2 < 3 }}{{ 1 == 1.0 }}{{ true == 1 }}{{ 'b' > 'a' }}{{ [1, 2] == [1, 2] }}"
                    "{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }}{{ none == none }}{{ missing == none }}", {}),
    ("logic", "{{ true and false }}{{ true or false }}{{ not true }}{{ not (1 == 2) }}"
              "{{ none or 'x' }}{{ 'a' and 'b' }}{{ 0 or [] }}{{ '' and 1 }}", {}),
    ("in", "{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in d }}{{ 'q' not in d }}{{ 'x' in missing }}",
     {"d": {"k": 1}}),
    ("conditional", "{{ 'yes' if flag else 'no' }}[{{ 'a' if false }}]{{ 1 if 0 else 2 if 1 else 3 }}",
     {"flag": True}),
    ("literals", "{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}] }} {{ {'q': '\"', 'b': 'x\\ny'} }} "
                 "{{ ('a', 1) }} {{ 'tab\\there' }} {{ \"a\" 'b' }} {{ '\\u00e9\\x41' }}", {}),
    ("subscripts", "{{ s[0] }}{{ s[-1] }}{{ s[1:] }}{{ s[:-1] }}{{ s[::-1] }}{{ xs[1] }}{{ xs[-1] }}"
                   "{{ xs[1:] }}{{ xs[::2] }}{{ xs[5] }}{{ d['k'] }}{{ d.k }}{{ d['nope'] }}{{ xs.0 }}",
     {"s": "héllo", "xs": [1, 2, 3], "d": {"k": "v"}}),
    ("string_filters", "{{ '  hi  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'aBc' | upper }}{{ 'aBc' | lower }}"
                       "|{{ 'hello WORLD' | capitalize }}|{{ 'hello wORLD it-is (x)' | title }}"
                       "|{{ 'a-b-c' | replace('-', '+') }}|{{ 'aaa' | replace('a', 'b', 2) }}"
                       "|{{ 'ab' | replace('', '.') }}|{{ 12 | string }}{{ none | string }}", {}),
    ("length_count", "{{ 'héllo🙂' | length }}{{ [1, 2] | count }}{{ {'a': 1} | length }}{{ missing | length }}", {}),
    ("first_last", "{{ [1, 2, 3] | first }}{{ [1, 2, 3] | last }}{{ 'abc' | first }}{{ 'abc' | last }}"
                   "[{{ [] | first }}]", {}),
    ("join", "{{ [1, 'a', none] | join(', ') }}|{{ msgs | join('/', attribute='role') }}|{{ 'abc' | join('-') }}",
     {"msgs": MULTI_TURN}),
    ("default", "{{ missing | default('d') }}{{ '' | default('e') }}{{ '' | default('f', true) }}"
                "{{ none | d('g') }}{{ 0 | default('h', boolean=true) }}", {}),
    ("tojson", "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\"\\n\\u2028' | tojson }}"
               "|{{ 'é' | tojson(ensure_ascii=true) }}|{{ [] | tojson(indent=4) }}|{{ {'b': 1, 'a': [1.0, none, false]} | tojson(sort_keys=true) }}"
               "|{{ '🙂' | tojson(ensure_ascii=true) }}",
     {"d": {"a": [1, 2.5, None, True], "b": {"c": "x", "e": {}}}}),
    ("int_float_list", "{{ '42' | int }}{{ '4.7' | int }}{{ 'x' | int }}{{ 'x' | int(7) }}{{ 3.9 | int }}"
                       "{{ '2.5' | float }}{{ 'ab' | list }}{{ {'a': 1} | list }}{{ (1, 2) | list }}", {}),
    ("select_map", "{{ msgs | selectattr('role', 'equalto', 'user') | list | length }}"
                   "{{ (msgs | selectattr('role', 'equalto', 'user') | list)[-1].content }}"
                   "{{ msgs | rejectattr('role', 'eq', 'user') | map(attribute='content') | list }}"
                   "{{ items | selectattr('on') | map(attribute='n') | join(',') }}"
                   "{{ [1, 2, 3, 4] | select('even') | list }}{{ [1, 2, 3] | reject('odd') | list }}"
                   "{{ ['a', 'b'] | map('upper') | join }}{{ items | map(attribute='x', default='-') | join }}",
     {"msgs": MULTI_TURN, "items": [{"n": 1, "on": True}, {"n": 2, "on": False}, {"n": 3}]}),
    ("generators", "{{ none | selectattr('a') | list }}{{ none | map(attribute='a') | list }}"
                   "{% if [] | select %}t{% endif %}{{ [1, 2] | map('string') | first }}"
                   "{% for x in [1, 2] | reject('odd') %}{{ x }}{% endfor %}", {}),
    ("generator_tojson", "{{ [1] | map('string') | tojson }}", {}),
    ("generator_length", "{{ [1, 2] | select | length }}", {}),
    ("indent", "[{{ 'a\\nb\\n\\nc' | indent }}][{{ 'a\\nb' | indent(2, true) }}][{{ 'a\\n\\nb' | indent('>', blank=true) }}]", {}),
    ("reverse_abs", "{{ [1, 2, 3] | reverse | list }}{{ 'abc' | reverse }}{{ -3 | abs }}{{ (-3) | abs }}", {}),
    ("tests", "{{ x is defined }}{{ y is defined }}{{ y is not defined }}{{ y is undefined }}{{ n is none }}"
              "{{ s is string }}{{ d is mapping }}{{ s is iterable }}{{ y is iterable }}{{ 1 is iterable }}"
              "{{ true is number }}{{ 1.5 is number }}{{ s is number }}{{ xs is sequence }}{{ true is true }}"
              "{{ 1 is true }}{{ false is false }}{{ true is boolean }}{{ 1 is integer }}{{ 1.0 is float }}"
              "{{ 6 is divisibleby 3 }}{{ 6 is divisibleby(4) }}{{ 3 is odd }}{{ 3 is even }}"
              "{{ 1 is in [1] }}{{ 'a' is eq 'a' }}{{ 'ab' is lower }}{{ raise_exception is callable }}",
     {"x": 1, "n": None, "s": "s", "d": {}, "xs": [1]}),
    ("str_methods", "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}"
                    "|{{ 'a b  c'.split() }}|{{ 'a,b,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}"
                    "|{{ 'hello'.startswith('he') }}{{ 'hello'.startswith(('x', 'h')) }}{{ 'hello'.endswith('lo') }}"
                    "|{{ 'aB'.upper() }}{{ 'aB'.lower() }}|{{ \"hello wORLD it's\".title() }}"
                    "|{{ 'hELLO'.capitalize() }}|{{ 'aXa'.replace('a', 'b') }}|{{ ', '.join(['x', 'y']) }}"
                    "|{{ 'a<t>b</t>c'.split('</t>')[0].split('<t>')[-1] }}", {}),
    ("dict_methods", "{{ d.keys() | list }}{{ d.values() | list }}{{ d.items() | list }}{{ d.get('a') }}"
                     "{{ d.get('z') }}{{ d.get('z', 5) }}", {"d": {"a": 1, "b": [2]}}),
    ("undefined", "[{{ missing }}][{{ missing is defined }}][{% for x in missing %}x{% endfor %}]"
                  "[{{ d.nokey }}][{{ d.nokey is defined }}][{{ s.nope is defined }}][{{ none.x is defined }}]"
                  "[{{ not missing }}][{% if missing %}t{% else %}f{% endif %}][{{ missing | trim }}]",
     {"d": {}, "s": "str"}),
    ("range_dict", "{{ range(3) | list }}{{ range(1, 7, 2) | list }}{{ dict(a=1, b='x') }}"
                   "{% for i in range(messages | length) %}{{ i }}{% endfor %}", {"messages": SINGLE_USER}),
    ("generation_block", "a{% generation %}b{{ 1 }}{% endgeneration %}c", {}),
    ("raise_exception", "x{{ raise_exception('Boom: ' ~ 3) }}", {}),
    ("attr_of_undefined", "{{ missing.attr }}", {}),
    ("undefined_plus", "{{ missing + 1 }}", {}),
    ("str_plus_int", "{{ 'a' + 1 }}", {}),
    ("tojson_undefined", "{{ missing | tojson }}", {}),
    ("set_attr_non_namespace", "{% set d = {'a': 1} %}{% set d.a = 2 %}{{ d.a }}", {}),
]


def sorted_keys(x):
    """The value with every dict's keys in sorted order (io::Json's order)."""
    return json.loads(json.dumps(x, sort_keys=True))


def render(source, variables):
    template = _compile_jinja_template(source)
    try:
        return {"expected": template.render(**variables)}
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:  # what raise_exception raises
            return {"exception": e.message}
        return {"error": type(e).__name__}
    except Exception as e:  # TypeError and the like
        return {"error": type(e).__name__}


def template_cases(name, tokens, extras):
    cases = []
    runs = [(chat, messages, {}) for chat, messages in CHATS.items()] + extras
    for chat, messages, extra in runs:
        for add_generation_prompt in (False, True):
            extra = sorted_keys(extra)
            variables = {"messages": sorted_keys(messages), "tools": extra.get("tools"),
                         "documents": extra.get("documents"),
                         "add_generation_prompt": add_generation_prompt}
            variables.update(tokens)
            variables.update({k: v for k, v in extra.items() if k not in ("tools", "documents")})
            source = open(os.path.join(FIXTURES, name + ".jinja"), encoding="utf-8").read()
            case = {"name": f"{name}/{chat}/{'gen' if add_generation_prompt else 'nogen'}",
                    "template": name, "messages": sorted_keys(messages),
                    "add_generation_prompt": add_generation_prompt,
                    "extra": sorted_keys({**tokens, **extra})}
            case.update(render(source, variables))
            cases.append(case)
    return cases


def feature_cases():
    cases = []
    for name, source, variables in FEATURES:
        variables = sorted_keys(variables)
        messages = variables.pop("messages", [])
        full = {"messages": messages, "tools": None, "documents": None, "add_generation_prompt": False}
        full.update(variables)
        case = {"name": "feature/" + name, "source": source, "messages": messages,
                "add_generation_prompt": False, "extra": variables}
        case.update(render(source, full))
        cases.append(case)
    return cases


def main():
    cases = []
    for name, (tokens, extras) in TEMPLATES.items():
        cases += template_cases(name, tokens, extras)
    cases += feature_cases()
    out = os.path.join(FIXTURES, "goldens.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"generator": "tests/python/make_chat_template_goldens.py",
                   "jinja2": jinja2.__version__, "cases": cases},
                  f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(cases)} cases -> {os.path.relpath(out)}", file=sys.stderr)


if __name__ == "__main__":
    main()
