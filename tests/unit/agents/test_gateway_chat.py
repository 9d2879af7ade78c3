"""Chat formats of the gateway: the tiny model's byte template and a Hugging Face tokenizer with a Qwen-style
template (built here with the `tokenizers` library, saved with `save_pretrained`: no hub)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.gateway.chat import ByteChatFormat, HFChatFormat, TemplateError, load_format, parse_tool_calls
from agents.tokenizer import TOKENIZER, TOOL_CALL_END_ID, TOOL_CALL_ID

# Qwen2.5's chat template (tools in the system message, Hermes <tool_call> JSON, tool results as <tool_response>)
QWEN_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- "\n\n# Tools\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within " }}
{{- "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, " }}
{{- "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
{%- if messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}{%- else %}
{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- for message in messages %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first)
      or (message.role == "assistant" and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
{%- elif message.role == "assistant" %}
{{- '<|im_start|>' + message.role }}{%- if message.content %}{{- '\n' + message.content }}
{%- endif %}
{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}
{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
{{- tool_call.arguments | tojson }}{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}
{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}
{%- endif %}
{{- '\n<tool_response>\n' }}{{- message.content }}{{- '\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"""
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]


def build_hf_tokenizer(path: Path, vocab_size: int = TOKENIZER.vocab_size) -> Path:
    """A byte-level BPE trained on a few strings (every text round-trips), ChatML specials, the Qwen template;
    `vocab_size` at most the tiny model's, so the tiny engines can sample in it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["what is 2+3?", "the answer is 5", "call the calculator"] * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<tool_call>", "</tool_call>"],
    )
    fast.chat_template = QWEN_TEMPLATE
    fast.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> HFChatFormat:
    fmt = load_format(str(build_hf_tokenizer(tmp_path_factory.mktemp("qwenlike"))))
    assert isinstance(fmt, HFChatFormat)
    return fmt


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "a+b",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
]


def test_hf_render_is_the_template_applied_by_transformers(hf):
    msgs = [{"role": "user", "content": "what is 2+3?"}]
    ids = hf.render(msgs, TOOLS)
    text = hf.decode(ids)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")
    assert '"name": "add"' in text and text.endswith(
        "<|im_start|>user\nwhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids == hf.tok.apply_chat_template(
        msgs, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def test_hf_delta_after_a_sampled_turn_equals_the_whole_conversation_rendered(hf):
    """Context = render(first) + sampled ids + closing + delta(new) is token for token what the template
    renders for the whole conversation (when the sampled ids are the assistant message's own tokens)."""
    first = [{"role": "user", "content": "what is 2+3?"}]
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'
    sampled = [*hf.encode(call), hf.eos_id]
    ans = hf.answer(sampled)
    assert ans.content is None and ans.tool_calls[0]["function"] == {"name": "add", "arguments": '{"a": 2}'}
    new = [{"role": "tool", "tool_call_id": ans.tool_calls[0]["id"], "content": "5"}]
    ctx = hf.render(first, TOOLS) + sampled + hf.closing(sampled) + hf.delta(new, TOOLS)
    whole = [*first, ans.message(), *new]
    rendered = hf.decode(hf.render(whole, TOOLS))
    assert hf.decode(ctx).replace("\n<tool_call>", "<tool_call>") == rendered.replace("\n<tool_call>", "<tool_call>")
    assert (
        hf.decode(hf.delta(new, TOOLS))
        == "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_hf_closing_adds_the_end_of_turn_a_cut_turn_lacks(hf):
    assert hf.decode(hf.closing([5, hf.eos_id])) == "\n"
    assert hf.decode(hf.closing([5])) == "<|im_end|>\n"


def test_hf_template_errors_are_template_errors(hf):
    with pytest.raises(TemplateError):
        hf.render([{"role": "user", "content": None}], None)


def test_a_directory_without_a_template_is_refused(tmp_path):
    path = build_hf_tokenizer(tmp_path / "t")
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ValueError, match="chat template"):
        load_format(str(path))
    with pytest.raises(ValueError, match="does not exist"):
        load_format(str(tmp_path / "missing"))


def test_byte_format_renders_chatml_over_spare_ids_and_parses_tool_calls():
    fmt = load_format("tiny")
    assert isinstance(fmt, ByteChatFormat)
    msgs = [{"role": "user", "content": "1+2?"}]
    ids = fmt.render(msgs, TOOLS)
    assert ids[0] == TOKENIZER.bos_id and "# Tools" in fmt.decode(ids)
    body = TOKENIZER.encode('{"name":"add","arguments":{"a":1}}', add_bos=False)
    sampled = [*TOKENIZER.encode("ok", add_bos=False), TOOL_CALL_ID, *body, TOOL_CALL_END_ID, TOKENIZER.eos_id]
    ans = fmt.answer(sampled)
    assert ans.content == "ok" and ans.tool_calls[0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    # the whole conversation rendered = the incremental context (byte tokens concatenate exactly)
    new = [{"role": "tool", "tool_call_id": "c", "content": "3"}]
    ctx = ids + sampled + fmt.closing(sampled) + fmt.delta(new, TOOLS)
    assert ctx == fmt.render([*msgs, {"role": "assistant", "content": "ok", "tool_calls": ans.tool_calls}, *new], TOOLS)


@pytest.mark.parametrize(
    "text,content,names",
    [
        ("plain text", "plain text", []),
        ('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', None, ["f"]),
        (
            'think\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>{"name": "g"}</tool_call>',
            "think",
            ["f", "g"],
        ),
        ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),  # a broken call stays visible
        ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),  # no name
    ],
)
def test_parse_tool_calls(text, content, names):
    got, calls = parse_tool_calls(text)
    assert got == content and [c["function"]["name"] for c in calls] == names
    assert all(json.loads(c["function"]["arguments"]) is not None and c["id"].startswith("call_") for c in calls)
