"""NInfer frontend: conversation form, chat-template rendering, prompt options, output parsing.

Modules:

* `conversation` — `Conversation`, `Message`, `Tool`, `ToolCall`, content parts (what every
  protocol adapter builds).
* `render` — the sandboxed Jinja environment with transformers' semantics; `TemplateError`.
* `capabilities` — `resolve_capabilities(template_text)`: thinking / preserve / effort switches.
* `options` — `resolve_options(RequestOptions, caps, ServerDefaults) -> PromptOptions`;
  `FrontendError(code, param, message)`.
* `lower` — Qwen-family lowering of system/developer messages at their positions.
* `encode` — `encode_prompt(...) -> EncodedPrompt` (text, ids, checkpoints, media) and
  `count_tokens`.
* `parser` / `toolcall` — `OutputParser` streaming reasoning, text and typed tool calls.
"""
