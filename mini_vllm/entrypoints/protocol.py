"""The OpenAI request bodies the server accepts, as pydantic models, and the error body it returns.

Mirrors ``vllm/entrypoints/openai/completion/protocol.py`` (``CompletionRequest``),
``chat_completion/protocol.py`` (``ChatCompletionRequest``) and ``engine/protocol.py``
(``ErrorResponse``/``ErrorInfo``): wrong types and out-of-range values fail here, before the
engine sees anything, and become a 400. Only the fields mini serves are declared; unknown fields
are ignored, as upstream ignores them (with a warning). Left out: logprobs, echo, suffix,
best_of, logit_bias by token string, the ``vllm_xargs`` extensions.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False


class StructuredOutputsRequest(OpenAIBaseModel):
    regex: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None


class SamplingFields(OpenAIBaseModel):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = 0
    n: int = Field(default=1, ge=1, le=16)
    seed: int | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    logprobs: Literal[False] | None = None  # mini has no logprobs to return
    structured_outputs: StructuredOutputsRequest | None = None  # vLLM's extension (extra_body)


class CompletionRequest(SamplingFields):
    prompt: str | list[int]
    return_token_ids: bool = False  # vLLM's extension: each choice also carries the token ids


class FunctionDef(OpenAIBaseModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Tool(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedToolChoice(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: dict[str, str]


class ChatMessage(OpenAIBaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class JsonSchemaFormat(OpenAIBaseModel):
    name: str = "schema"
    schema_: dict[str, Any] = Field(alias="schema")


class ResponseFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    response_format: ResponseFormat | None = None


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict:
    """``{"error": {"message", "type", "param", "code"}}``, upstream's ``ErrorResponse``."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}
