"""The call formats of a tool episode (``tools.format``): how a model turn's call is read and how
the observation that answers it is written.

* ``tags`` (the default): the model writes ``call_open + input + call_close`` (``<calc>12*7</calc>``);
  the turn stops at ``call_close`` and the observation is ``result_open + output + result_close``
  (``<result>84</result>``). A format the embedded model learns from a few-shot prompt.
* ``chat_template``: the hermes convention that Qwen2.5's chat template (and vLLM's / verl's
  ``hermes`` tool parser) uses. The model writes
  ``<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>`` and ends its
  turn with EOS; the observation is the tokenizer's own chat-template rendering of a
  ``{"role": "tool", "content": output}`` message followed by the next assistant turn's
  generation prompt. It is the text delta of two renders of a fixed short conversation, with and
  without the tool message (verl's ``tool_agent_loop`` renders the tool message alone and strips
  the system prompt; the delta gives the same text for the templates here), starting right after
  the EOS that ended the model's turn. So the tokens the template puts between that EOS and the
  tool message (SmolLM2 and Qwen2.5: a newline) are observation tokens too.

  The turn ends at EOS, not at the stop string ``</tool_call>``: the model's EOS after its call is
  its own token (sampled, trained), as in every chat transcript with a tool call, and a turn may
  hold several calls (hermes allows parallel calls; each gets its tool message, in order). Stopping
  at ``</tool_call>`` would instead put the template's EOS into the observation, so the model would
  never be trained to end a calling turn.

Both formats only read and write text around token ids: the episode rollout
(:mod:`harness.rollout.episode`) appends the observation text's own ids, tokenized alone, to the
ids the backend sampled.
"""

from __future__ import annotations

import json
import logging

from harness.tools.base import Observation, ToolRunner

log = logging.getLogger(__name__)

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"  # hermes / Qwen2.5
_MARK = "ASSISTANT-TURN-7f3a"  # the model turn's stand-in in the renders of chat_template's delta


class TagFormat:
    """``tools.format=tags``: ``<calc>input</calc>`` -> ``<result>output</result>`` (the params' tags)."""

    def __init__(self, tool: ToolRunner, tokenizer):
        self.tool, self.tokenizer = tool, tokenizer
        self.stop = tool.params.call_close  # a turn's stop string

    def calls(self, turn_ids: list[int], stop: str) -> list | None:
        """The call a turn made: None when it made none (it did not end at ``call_close``), else a
        one-item list: the text between the last ``call_open`` and the ``call_close`` that ended the
        turn, or an error observation when no ``call_open`` precedes it."""
        if stop != "stop":
            return None
        p = self.tool.params
        text = self.tokenizer.decode(turn_ids)
        head = text[: text.find(p.call_close)]
        start = head.rfind(p.call_open)
        if start < 0:
            return [self.tool.error(f"no {p.call_open} before {p.call_close}")]
        return [head[start + len(p.call_open) :]]

    def observation(self, observations: list[Observation]) -> str:
        """The text appended after the turn: the one observation between the result tags."""
        (obs,) = observations
        return self.tool.wrap(obs)


class ChatTemplateFormat:
    """``tools.format=chat_template``: hermes ``<tool_call>`` JSON in, the chat template's tool message out.

    Args:
        tool: the tool's runner; its tool has ``schema()`` (an OpenAI-style function schema with
            one string argument, the call's input).
        tokenizer: the policy's tokenizer (its ``chat_template`` and ``eos_token``).
    Raises:
        ValueError: the tool has no schema, or the chat template does not end an assistant message
            with the EOS token followed by what it renders for a tool message (the delta is undefined).
    """

    stop = None  # a turn ends at EOS (module docstring)

    def __init__(self, tool: ToolRunner, tokenizer):
        schema = tool.schema()
        if schema is None:
            raise ValueError(f"tools.format=chat_template: tool {tool.params.name!r} declares no JSON schema")
        props = schema["function"]["parameters"]["properties"]
        if len(props) != 1:
            raise ValueError(f"tools.format=chat_template: tool {tool.params.name!r} must take one argument, "
                             f"its schema has {sorted(props)}")
        self.tool, self.tokenizer, self.schemas = tool, tokenizer, [schema]
        self.name, self.argument = schema["function"]["name"], next(iter(props))
        head, end = self._render([], generation_prompt=False), _MARK + tokenizer.eos_token
        self._prefix = head[: head.find(end) + len(end)] if end in head else None  # up to the turn's EOS
        self.observation([Observation("0", False)])  # a template that cannot render the delta fails now
        plain = tokenizer.apply_chat_template([{"role": "user", "content": "?"}], tokenize=False)
        if plain == tokenizer.apply_chat_template([{"role": "user", "content": "?"}], tools=self.schemas, tokenize=False):
            log.warning("tools.format=chat_template: this tokenizer's chat template does not render the tools' JSON "
                        "schema, so the prompt does not describe tool %r; only the task's worked examples show a call",
                        self.name)

    def _render(self, tool_messages: list[dict], generation_prompt: bool) -> str:
        conversation = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARK}]
        return self.tokenizer.apply_chat_template(conversation + tool_messages, tools=self.schemas, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def observation(self, observations: list[Observation]) -> str:
        """The text after the EOS of a turn that made ``len(observations)`` calls: the template's
        rendering of one tool message per observation (content: its text) and the next assistant
        turn's generation prompt.

        Raises:
            ValueError: the template does not render ``<turn> + EOS`` as the same prefix in both renders.
        """
        messages = [{"role": "tool", "name": self.name, "content": o.text} for o in observations]
        full = self._render(messages, generation_prompt=True)
        if self._prefix is None or not full.startswith(self._prefix):
            raise ValueError("tools.format=chat_template: the tokenizer's chat template does not end an assistant "
                             f"message with its EOS token {self.tokenizer.eos_token!r} followed by the tool "
                             "message; use tools.format=tags")
        return full[len(self._prefix) :]

    def calls(self, turn_ids: list[int], stop: str) -> list | None:
        """The calls a turn made, in order: None when it made none (it did not end at EOS, or holds
        no ``<tool_call>``); else per ``<tool_call>...</tool_call>`` block the argument's text, or
        an error observation (bad JSON, not ``{"name", "arguments"}``, another tool's name, a
        missing, extra or non-string argument, an unclosed block)."""
        if stop != "eos":
            return None
        text = self.tokenizer.decode(turn_ids)
        if TOOL_CALL_OPEN not in text:
            return None
        calls, pos = [], text.find(TOOL_CALL_OPEN)
        while pos >= 0:
            end = text.find(TOOL_CALL_CLOSE, pos)
            if end < 0:
                calls.append(self.tool.error(f"{TOOL_CALL_OPEN} without {TOOL_CALL_CLOSE}"))
                break
            calls.append(self._parse(text[pos + len(TOOL_CALL_OPEN) : end]))
            pos = text.find(TOOL_CALL_OPEN, end)
        return calls

    def _parse(self, body: str):
        """The argument's text of one call's JSON ``body``, or an error observation."""
        try:
            call = json.loads(body)
        except json.JSONDecodeError as e:
            return self.tool.error(f"tool call is not JSON ({e.msg})")
        if not isinstance(call, dict) or set(call) != {"name", "arguments"} or not isinstance(call["arguments"], dict):
            return self.tool.error('expected {"name": ..., "arguments": {...}}')
        if call["name"] != self.name:
            return self.tool.error(f"unknown tool {str(call['name'])[:40]!r}; expected {self.name!r}")
        args = call["arguments"]
        if self.argument not in args:
            return self.tool.error(f"missing argument {self.argument!r}")
        if len(args) > 1:
            return self.tool.error(f"unexpected arguments {sorted(args.keys() - {self.argument})}"[:80])
        if not isinstance(args[self.argument], str):
            return self.tool.error(f"argument {self.argument!r} must be a string")
        return args[self.argument]


def hermes_call(schema: dict, value: str) -> str:
    """The text of a call to the tool of ``schema`` with its one argument ``value``, as a hermes
    model writes it (Qwen2.5's template renders an assistant's ``tool_calls`` so):
    ``<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>``."""
    (argument,) = schema["function"]["parameters"]["properties"]
    call = {"name": schema["function"]["name"], "arguments": {argument: value}}
    return f"{TOOL_CALL_OPEN}\n{json.dumps(call)}\n{TOOL_CALL_CLOSE}"


# tools.format=<name> -> its class
FORMATS = {"tags": TagFormat, "chat_template": ChatTemplateFormat}


def build_format(tool: ToolRunner, tokenizer):
    """The call format named by ``tool.params.format``.

    Raises:
        ValueError: an unknown format (lists the valid ones), or the format's own refusal.
    """
    fmt = tool.params.format
    if fmt not in FORMATS:
        raise ValueError(f"tools.format={fmt!r}: expected one of {sorted(FORMATS)}")
    return FORMATS[fmt](tool, tokenizer)
