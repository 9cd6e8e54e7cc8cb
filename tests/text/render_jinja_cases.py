#!/usr/bin/env python3
"""Renders the further chat-template cases with Python's Jinja2 (HF
apply_chat_template settings) and writes chat_template_cases.json next to
this script. Needs python3-jinja2; the C++ test reads the committed JSON."""
import json
import os
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = datetime(2026, 12, 1, 12, 0, 0)


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def env():
    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=['jinja2.ext.loopcontrols'])
    e.filters['tojson'] = tojson
    e.globals['raise_exception'] = raise_exception
    e.globals['strftime_now'] = lambda fmt: NOW.strftime(fmt)
    return e


MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ü"},
        {"role": "assistant", "content": "Hello!"}]
V = {"messages": MSGS, "xs": [3, 1, 2], "d": {"b": 2, "a": 1}, "s": "  Hello World  ", "n": 7, "f": 2.5,
     "people": [{"name": "Bo", "age": 30, "tags": ["x"]}, {"name": "al", "age": 25}, {"name": "Cy", "age": 30}],
     "nested": {"a": {"b": [1, {"c": "deep"}]}}, "empty": [], "t": True, "none": None}

CASES = [
    # literals and printing
    "{{ 1 }}|{{ 1.0 }}|{{ 0.5 }}|{{ 1e3 }}|{{ -3 }}|{{ 'a\\n\\'b' }}|{{ \"q\" }}",
    "{{ [1, 'a', none, true, 2.5] }}|{{ {'k': 'v', 'n': [1]} }}|{{ True }}{{ None }}{{ false }}",
    "{{ (1, 2) | list }}|{{ [] }}|{{ {} }}|{{ 'it\\'s' ~ [\"it's\"] | string }}",
    "{{ 1/2 }} {{ 7//2 }} {{ -7//2 }} {{ 7%3 }} {{ -7%3 }} {{ 2**10 }} {{ 7/7 }} {{ 1.5*2 }} {{ 3-4.5 }}",
    "{{ 'ab' * 3 }}|{{ [1] * 2 }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ 1 ~ 2 ~ 'x' }}|{{ 0.1 + 0.2 }}",
    "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }}",
    "{{ 'a' in 'cat' }} {{ 2 in xs }} {{ 'a' in d }} {{ 'z' not in d }} {{ 5 not in xs }}",
    "{{ not t }} {{ t and 'yes' }} {{ none or 'fallback' }} {{ 0 or '' }} {{ 'x' if n > 5 else 'y' }} [{{ 'x' if false }}]",
    # undefined
    "[{{ missing }}]{{ missing is defined }}{{ missing is undefined }}{{ d.zz is defined }}{% if missing %}no{% endif %}",
    "{% for x in missing %}x{% else %}empty{% endfor %}|{{ missing | default('dflt') }}|{{ '' | default('e', true) }}|{{ '' | d('e') }}",
    "{{ missing.attr }}",
    "{{ missing + 1 }}",
    "{{ d.zz.yy }}",
    # attributes, subscripts, slices
    "{{ nested.a.b[1].c }} {{ nested['a']['b'][0] }} {{ people[0]['name'] }} {{ xs[-1] }} {{ people[-1].name }}",
    "{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ 'hello'[1:4] }} {{ 'hello'[::-1] }} {{ 'héllo'[1] }} {{ xs[5:] }}",
    "{{ messages[1:] | map(attribute='role') | join(',') }}",
    # loops
    "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for x in xs %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}",
    "{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{{ loop.last }};{% endfor %}",
    "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in range(1, 10, 3) %}{{ x }}{% endfor %}|{% for x in range(5, 0, -2) %}{{ x }}{% endfor %}|{% for c in 'abc' %}{{ c }}.{% endfor %}",
    "{% for x in [] %}x{% else %}none{% endfor %}{% for i in range(2) %}{% for j in range(2) %}{{ i }}{{ j }}{{ loop.index }} {% endfor %}{% endfor %}",
    "{% set x = 1 %}{% for i in range(3) %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}",
    # set / namespace / block set
    "{% set ns = namespace(count=0, found=false) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% if m.role == 'user' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (3, 4) %}{{ t[0] }}{% set blk %}Hello {{ n }}!{% endset %}[{{ blk }}]{% set u | upper %}shout{% endset %}{{ u }}",
    # macros
    "{% macro greet(name, greeting='Hi') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bo') }} {{ greet('Al', 'Yo') }} {{ greet(greeting='Hey', name='Cy') }}",
    "{% macro render(m) %}<{{ m.role }}>{{ m.content | trim }}{% endmacro %}{% for m in messages %}{{ render(m) }}{% endfor %}",
    # tests
    "{{ n is odd }}{{ n is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ s is string }}{{ n is number }}{{ n is integer }}{{ f is float }}{{ d is mapping }}{{ xs is iterable }}{{ xs is sequence }}{{ t is boolean }}{{ t is true }}{{ t is false }}{{ none is none }}",
    "{{ 3 is eq 3 }}{{ 3 is equalto 4 }}{{ 3 is ne 4 }}{{ 3 is lt 4 }}{{ 3 is gt 4 }}{{ 3 is le 3 }}{{ 3 is ge 4 }}{{ 2 is in xs }}{{ range is callable }}{{ n is not string }}{{ 'x' is not defined }}",
    # filters
    "{{ s | trim }}|{{ s | length }}|{{ xs | count }}|{{ 'héllo' | length }}|{{ s | upper }}|{{ s | lower }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}",
    "{{ xs | first }} {{ xs | last }} {{ xs | list }} {{ 'ab' | list }} {{ xs | sort }} {{ xs | sort(reverse=true) }} {{ xs | reverse | list }} {{ [1, 2, 1, 3] | unique | list }}",
    "{{ people | map(attribute='name') | join(', ') }}|{{ people | selectattr('age', 'equalto', 30) | map(attribute='name') | list }}|{{ people | rejectattr('tags') | map(attribute='name') | list }}|{{ people | selectattr('tags', 'defined') | list | length }}",
    "{{ xs | select('odd') | list }} {{ xs | reject('odd') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ ['a', 'B'] | map('upper') | list }} {{ xs | map('string') | join('-') }}",
    "{{ people | sort(attribute='name') | map(attribute='name') | join }} {{ people | sort(attribute='age') | map(attribute='name') | join }} {% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %} {% for k, v in d | items %}{{ k }}{{ v }}{% endfor %} {{ d | dictsort | first | first }}",
    "{{ 'a,b' | replace(',', ';') }} {{ '42' | int + 1 }} {{ 'x' | int }} {{ '2.5' | float }} {{ 3 | float }} {{ 2.7 | int }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 'one two  three' | wordcount }}",
    "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'x' | safe }}|{{ n | string }}|{{ [1, 2, 3, 4, 5] | batch(2) | list }}",
    # tojson
    "{{ d | tojson }}|{{ messages[1] | tojson }}|{{ 'é\"\\n' | tojson }}|{{ [1.0, 2, none, true] | tojson }}",
    "{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|{{ people[0] | tojson(separators=(',', ':')) }}|{{ {} | tojson(indent=2) }}|{{ {'a': []} | tojson(indent=2) }}",
    # methods
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}",
    "{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}{{ 'hi there'.title() }}{{ 'hi'.capitalize() }}{{ 'aXbX'.replace('X', '-') }}{{ 'hello'.find('l') }}{{ 'hello'.count('l') }}",
    "{{ d.get('a') }} {{ d.get('zz', 'def') }} {{ d.get('zz') }} {{ d.keys() | list }} {{ d.values() | list }} {{ ', '.join(['a', 'b']) }}",
    # whitespace control
    "a  \n  {% if true %}\n  yes\n  {% endif %}\nb",
    "a {{- ' x ' -}} b\n{%- if true -%}\n  c  \n{%- endif -%}\n d",
    "{# comment #}\n  {# indented comment #}\nx {#- trimmed -#} y\n{%+ if true %}keep{% endif %}",
    "line\n    {% for x in xs %}\n    {{ x }}\n    {% endfor %}\nend",
    "{% raw %}{{ not rendered }}{% endraw %}|{% filter upper %}up {{ n }}{% endfilter %}",
    # globals
    "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M') }}",
    "{{ raise_exception('Custom failure: ' ~ n) }}",
    "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}",
    # errors
    "{% for x in 5 %}{% endfor %}",
    "{{ 1 + 'a' }}",
    "{{ 1 / 0 }}",
    "{% if true %}unterminated",
    "{{ xs.append(4) }}",
    "{{ 'a' < 1 }}",
    "{{ 2.675 | round(2) }} {{ 0.5 | round }} {{ 1.5 | round }} {{ 2.5 | round(0, 'floor') }} {{ 2.1 | round(0, 'ceil') }}",
    "{{ 1e20 }} {{ 1.5e-7 }} {{ 123456789.125 }} {{ 1/3 }} {{ 2**0.5 }} {{ 10/4 }} {{ 1e16 }} {{ 100.0 }}",
    "{% set x = {'a': [1, {'b': none}]} %}{{ x }}|{{ x | tojson }}|{{ x | tojson(indent='  ') }}",
    "{%- for m in messages -%}\n  {%- if m.role == 'system' -%}\n    SYS:{{ m.content }}\n  {% elif m.role == 'user' %}\n    U:{{ m.content }}\n  {% else %}\n    A:{{ m.content }}\n  {%- endif %}\n{% endfor -%}\n!",
    "{{ messages | selectattr('role', 'eq', 'user') | list | length }} {{ messages | rejectattr('role', 'in', ['user', 'system']) | map(attribute='content') | first }} {{ people | map(attribute='zz', default='?') | join }}",
    "{{ 'x' is lower }}{{ 'X' is upper }}{{ xs is mapping }}{{ d is iterable }}{{ 1 is sameas 1 }}{{ none is sameas none }}",
    "{% if n is defined and n > 5 and not (n > 10) %}ok{% endif %}{{ -n|abs }}{{ (1 + 2) * 3 }}{{ 2 + 3 * 4 }}{{ 2 ** 3 ** 2 }}{{ 10 - 2 - 3 }}",
    "{{ ('a' ~ 'b') | upper }}{{ 'abc' | upper | replace('B', '_') }}{{ [3, 1] | sort | first }}{{ ['b', 'A', 'c'] | sort | join }}{{ ['b', 'A', 'c'] | sort(case_sensitive=true) | join }}",
    "{{ undefined_thing | length }} {{ (undefined_thing or []) | length }} {{ none | string }} {{ none is defined }}",
]


def main():
    e = env()
    out = []
    for i, src in enumerate(CASES):
        case = {"id": "case-%02d" % i, "template_text": src, "messages": MSGS, "add_generation_prompt": False,
                "variables": {k: v for k, v in V.items() if k != "messages"}}
        try:
            case["expected"] = e.from_string(src).render(**V, add_generation_prompt=False)
        except Exception as ex:  # noqa: BLE001
            msg = str(ex)
            # keep an excerpt that a different renderer can be asked to contain
            case["expected_error"] = "chat template error" if isinstance(ex, jinja2.TemplateSyntaxError) else msg
            case["python_error"] = "%s: %s" % (type(ex).__name__, msg)
        out.append(case)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_template_cases.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"renderer": "Jinja2 %s, HF apply_chat_template settings" % jinja2.__version__, "cases": out},
                  fh, ensure_ascii=False, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
