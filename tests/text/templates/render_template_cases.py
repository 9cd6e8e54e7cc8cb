#!/usr/bin/env python3
"""Renders conversations with tools, tool calls, tool results and reasoning
through each real chat template in this folder with Python's Jinja2 (HF
apply_chat_template settings, as ../render_jinja_cases.py) and writes
NAME.cases.json beside NAME.jinja. Needs python3-jinja2; the C++ test
(ChatTemplate.RealTemplates) reads the committed JSON."""
import glob
import json
import os
import sys

import jinja2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from render_jinja_cases import env  # noqa: E402  (the same environment as the further cases)

HERE = os.path.dirname(os.path.abspath(__file__))

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city's name"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                         "parameters": {"type": "object", "properties": {}}}}
USER = {"role": "user", "content": "What is the weather in Paris?"}
# Mistral's template wants 9-character call ids.
CALL = {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
RESULT = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 21}"}

# Special tokens per template (what a GGUF of the model would carry).
TOKENS = {
    "Qwen-Qwen3-0.6B": ("", "<|im_end|>"),
    "google-gemma-3-it": ("<bos>", "<eos>"),
    "microsoft-phi-4": ("", "<|im_end|>"),
    "microsoft-Phi-4-mini-instruct": ("", "<|endoftext|>"),
    "llama-cpp-microsoft-Phi-4-mini-instruct": ("", "<|endoftext|>"),
    "Mistral-Small-3.2-24B-Instruct-2506": ("<s>", "</s>"),
    "openai-gpt-oss-120b": ("", "<|return|>"),
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
}


def cases_for(name):
    """(id, messages, add_generation_prompt, extra variables)."""
    out = [
        ("plain", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour."}], True, {}),
        ("no-system", [USER], True, {}),
        ("tools-offered", [{"role": "system", "content": "Use tools when they help."}, USER], True,
         {"tools": [WEATHER, TIME]}),
        ("tools-no-system", [USER], True, {"tools": [WEATHER]}),
        ("tool-call-and-result", [USER, {"role": "assistant", "content": "", "tool_calls": [CALL]}, RESULT], True,
         {"tools": [WEATHER]}),
        ("tool-result-then-answer", [USER, {"role": "assistant", "content": "", "tool_calls": [CALL]}, RESULT,
                                     {"role": "assistant", "content": "It is 21 degrees."},
                                     {"role": "user", "content": "Thanks!"}], True, {"tools": [WEATHER]}),
        # Reasoning kept apart: Qwen3 reads reasoning_content, gpt-oss thinking; the others ignore both.
        ("reasoning-earlier-turn", [USER, {"role": "assistant", "content": "Sunny.", "reasoning_content": "SECRET-1",
                                           "thinking": "SECRET-1"}, {"role": "user", "content": "And Lyon?"}], True, {}),
        ("reasoning-with-call", [USER, {"role": "assistant", "content": "", "reasoning_content": "I need the tool.",
                                        "thinking": "I need the tool.", "tool_calls": [CALL]}, RESULT], True,
         {"tools": [WEATHER]}),
        ("reasoning-last-turn-training", [USER, {"role": "assistant", "content": "Sunny.",
                                                 "reasoning_content": "Look it up.", "thinking": "Look it up."}], False, {}),
    ]
    if name == "Qwen-Qwen3-0.6B":
        out.append(("enable-thinking-false", [USER], True, {"enable_thinking": False}))
    if name == "openai-gpt-oss-120b":
        out.append(("reasoning-effort-high", [{"role": "developer", "content": "Answer in French."}, USER], True,
                    {"reasoning_effort": "high", "builtin_tools": ["python"]}))
    if name == "microsoft-Phi-4-mini-instruct":
        # Phi-4-mini's own template reads tools from the system message (a JSON text), not from `tools`.
        out.append(("tools-in-system-message", [{"role": "system", "content": "You are helpful.",
                                                 "tools": json.dumps([WEATHER["function"]])}, USER], True, {}))
    if name.startswith("meta-llama"):
        out.append(("tools-in-system", [USER], True, {"tools": [WEATHER], "tools_in_user_message": False}))
        out.append(("builtin-tools", [USER], True, {"tools": [WEATHER], "builtin_tools": ["wolfram_alpha"]}))
    return out


def main():
    e = env()
    for path in sorted(glob.glob(os.path.join(HERE, "*.jinja"))):
        name = os.path.basename(path)[:-len(".jinja")]
        with open(path, encoding="utf-8") as fh:
            tpl = e.from_string(fh.read())
        bos, eos = TOKENS[name]
        cases = []
        for cid, messages, agp, extra in cases_for(name):
            variables = {"bos_token": bos, "eos_token": eos, **extra}
            case = {"id": cid, "messages": messages, "add_generation_prompt": agp, "variables": variables}
            try:
                case["expected"] = tpl.render(messages=messages, add_generation_prompt=agp, **variables)
            except jinja2.TemplateError as ex:
                case["expected_error"] = str(ex)
            cases.append(case)
        with open(os.path.join(HERE, name + ".cases.json"), "w", encoding="utf-8") as fh:
            json.dump({"template": name + ".jinja", "renderer": "Jinja2 %s, HF apply_chat_template settings" %
                       jinja2.__version__, "cases": cases}, fh, ensure_ascii=False, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()
