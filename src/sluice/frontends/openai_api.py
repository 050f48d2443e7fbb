"""The OpenAI-compatible API on the HTTP port (``/v1/models``, ``/v1/completions``,
``/v1/chat/completions``, ``/v1/embeddings``), served by ``HttpFrontend`` from its route table.

Rules of this file:
- Translate only: OpenAI's JSON (``protocol/openai_schema``) -> model requests
  (``protocol/openai_tensors``) -> ``InferenceService.infer_stream``, the path of
  ``generate_stream`` -> OpenAI's JSON or events (``protocol/openai_codec``). Each choice is
  one model request: statistics, metrics, queues, admission and cancellation are those of
  any inference. ``n`` choices of ``m`` prompts are ``n * m`` requests, in flight at once;
  choice ``j`` of a prompt gets the seed ``seed + j`` (wrapping in 64 bits), so that seeded
  choices differ and repeat.
- A non-streaming answer joins the text of every response of its request. A stream sends one
  chunk per response that has text, and one that finishes each choice.
- Errors before the first response are the answer's status (``HttpFrontend`` words them in
  OpenAI's shape); an error after it is an error event that ends the stream.
- The client going away cancels every request of its call (the model sees
  ``is_cancelled()``; the request counts as a failure, reason CANCELED).
- Usage: the counts the model answers (``num_input_tokens``/``num_output_tokens``), else
  ``ChatFormat.count`` (the tokenizer's, or whitespace words). ``finish_reason``: the model's
  where it answers one, else "length" when the completion's count reached ``max_tokens``,
  else "stop".
- Trace: a call is sampled on its model once its body is parsed; the first choice's request
  carries the trace (HTTP_RECV_*, REQUEST_*, INFER_RESPONSE_COMPLETE per response,
  HTTP_SEND_* per event or around the answer).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import Internal, NotFound, ServerError
from ..protocol import openai_codec as codec
from ..protocol.openai_schema import (
    FieldError,
    ModelNotFound,
    Sampling,
    parse_chat,
    parse_completion,
    parse_embedding,
)
from ..protocol.openai_tensors import (
    EMBEDDING,
    Convention,
    convention_of,
    embedding_request,
    embedding_vector,
    generation_request,
    response_counts,
    response_finish,
    response_text,
)
from ..service import InferenceService
from ..types import InferRequest, InferResponse
from .errors import http_error
from .openai_chat import ChatFormat

__all__ = ["OpenAIEdge", "Reply"]

# awaits an answer unless the client leaves first (HttpFrontend's _unless_gone for the call)
Guard = Callable[[Awaitable[Any]], Awaitable[Any]]
Item = tuple[int, InferResponse]


@dataclass(slots=True)
class Reply:
    """A JSON document to answer, or the events of a stream; the call's trace, if sampled
    (the front-end stamps the send and finishes it)."""

    doc: dict[str, Any] | None = None
    events: AsyncIterator[bytes] | None = None
    trace: Any = None


@dataclass(slots=True)
class _Choice:
    """What the responses of one choice's request said."""

    prompt: str
    parts: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish: str | None = None

    def add(self, resp: InferResponse) -> str:
        err = resp.error
        if err is not None:
            raise err if isinstance(err, ServerError) else Internal(str(err))
        text = response_text(resp)
        if text:
            self.parts.append(text)
        prompt, completion = response_counts(resp)
        if prompt is not None and self.prompt_tokens is None:
            self.prompt_tokens = prompt
        if completion is not None:
            self.completion_tokens = (self.completion_tokens or 0) + completion
        finish = response_finish(resp)
        if finish is not None:
            self.finish = finish
        return text


def _wrap64(value: int) -> int:
    return (value + 2**63) % 2**64 - 2**63


async def _merged(
    service: InferenceService, requests: Sequence[InferRequest]
) -> AsyncIterator[Item]:
    """The responses of ``requests`` as they come, as (request index, response). Closing it
    closes every request's stream (cancelling what is still running)."""
    if len(requests) == 1:
        stream = service.infer_stream(requests[0])
        try:
            async for resp in stream:
                yield 0, resp
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        return
    queue: asyncio.Queue[tuple[int, InferResponse | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, request: InferRequest) -> None:
        stream = service.infer_stream(request)
        try:
            async for resp in stream:
                queue.put_nowait((i, resp))
            queue.put_nowait((i, None))
        except Exception as exc:
            queue.put_nowait((i, exc))
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    tasks = [asyncio.ensure_future(pump(i, r)) for i, r in enumerate(requests)]
    try:
        left = len(tasks)
        while left:
            i, item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class OpenAIEdge:
    """The ``/v1`` calls over ``service``; ``chat`` renders messages and counts tokens."""

    __slots__ = ("service", "tracer", "chat", "default_max_tokens")

    def __init__(
        self,
        service: InferenceService,
        chat: ChatFormat | None = None,
        default_max_tokens: int = 16,
    ) -> None:
        self.service = service
        self.tracer = service.tracer
        self.chat = chat or ChatFormat()
        self.default_max_tokens = default_max_tokens  # Triton's --default-max-tokens

    # ------------------------------------------------------------------ models
    def models(self) -> dict[str, Any]:
        return codec.models_doc(self.service.served_models())

    def model(self, name: str) -> dict[str, Any]:
        for served, created in self.service.served_models():
            if served == name:
                return codec.model_doc(served, created)
        raise ModelNotFound(f"The model '{name}' does not exist (no model of that name is serving)")

    async def _convention(self, model: str) -> Convention | None:
        try:
            meta = await self.service.model_metadata(model)
        except NotFound as exc:
            raise ModelNotFound(f"The model '{model}' does not exist: {exc.message}") from None
        except ServerError as exc:  # a name that is no model name
            raise FieldError("model", exc.message) from None
        return convention_of(meta)

    def _sample(self, model: str, recv_ns: int, request: InferRequest) -> Any:
        if not self.tracer.on:
            return None
        trace = self.tracer.sample(model)
        if trace is not None:
            trace.stamp("HTTP_RECV_START", recv_ns)
            trace.stamp("HTTP_RECV_END")
            request.trace = trace
        return trace

    # ------------------------------------------------------------------ generation
    async def completions(self, body: bytes, guard: Guard, recv_ns: int) -> Reply:
        req = parse_completion(body)
        return await self._generate(
            "completion", req.model, req.prompts, req.sampling, req.echo, guard, recv_ns
        )

    async def chat_completions(self, body: bytes, guard: Guard, recv_ns: int) -> Reply:
        req = parse_chat(body)
        conv = await self._convention(req.model)  # an unknown model before the template's errors
        prompt = self.chat.render(req.messages)
        return await self._generate(
            "chat", req.model, (prompt,), req.sampling, False, guard, recv_ns, conv
        )

    async def _generate(
        self,
        kind: str,
        model: str,
        prompts: Sequence[str],
        s: Sampling,
        echo: bool,
        guard: Guard,
        recv_ns: int,
        conv: Convention | None = None,
    ) -> Reply:
        conv = conv or await self._convention(model)
        if conv is None or conv.kind == EMBEDDING:
            raise FieldError(
                "model",
                f"model '{model}' cannot generate text: it follows neither Triton's vLLM nor its "
                "TensorRT-LLM convention (an input 'text_input', answered in 'text_output')",
            )
        max_tokens = s.max_tokens if s.max_tokens is not None else self.default_max_tokens
        requests: list[InferRequest] = []
        choices: list[_Choice] = []
        for prompt in prompts:
            for j in range(s.n):
                seed = None if s.seed is None else _wrap64(s.seed + j)
                requests.append(
                    generation_request(
                        conv, model, prompt, s, max_tokens=max_tokens, seed=seed, echo=echo
                    )
                )
                choices.append(_Choice(prompt))
        trace = self._sample(model, recv_ns, requests[0])
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        stream = _merged(self.service, requests)
        try:
            if not s.stream:
                await guard(self._drain(stream, choices))
                if trace is not None:
                    trace.stamp("INFER_RESPONSE_COMPLETE")
                ends = [self._end(c, max_tokens, echo) for c in choices]
                usage = self._usage(choices, ends, s.n)
                rows = [("".join(c.parts), end[1]) for c, end in zip(choices, ends, strict=True)]
                body = codec.chat_body if kind == "chat" else codec.completion_body
                return Reply(doc=body(rid, created, model, rows, usage), trace=trace)
            try:  # errors before the first response are the answer's status
                first: Item | None = await guard(anext(stream))
            except StopAsyncIteration:
                first = None
        except BaseException:
            await stream.aclose()  # type: ignore[attr-defined]
            if trace is not None:
                trace.finish()
            raise
        writer = codec.ChunkWriter(kind, rid, created, model)
        events = self._events(writer, first, stream, choices, s, max_tokens, echo, trace)
        return Reply(events=events)

    @staticmethod
    async def _drain(stream: AsyncIterator[Item], choices: list[_Choice]) -> None:
        try:
            async for i, resp in stream:
                choices[i].add(resp)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    def _end(self, c: _Choice, max_tokens: int, echo: bool) -> tuple[int, str]:
        """A finished choice's (completion tokens, finish_reason)."""
        n = c.completion_tokens
        if n is None:
            n = self.chat.count("".join(c.parts))
            if echo:  # the model's text starts with the prompt
                n = max(0, n - self.chat.count(c.prompt))
        return n, c.finish or ("length" if n >= max_tokens else "stop")

    def _usage(self, choices: list[_Choice], ends: list[tuple[int, str]], n: int) -> dict[str, int]:
        """Each prompt counted once (its first choice's), every choice's completion."""
        prompt = 0
        for c in choices[::n]:
            prompt += c.prompt_tokens if c.prompt_tokens is not None else self.chat.count(c.prompt)
        return codec.usage_doc(prompt, sum(e[0] for e in ends))

    async def _events(
        self,
        w: codec.ChunkWriter,
        first: Item | None,
        stream: AsyncIterator[Item],
        choices: list[_Choice],
        s: Sampling,
        max_tokens: int,
        echo: bool,
        trace: Any,
    ) -> AsyncIterator[bytes]:
        ends: list[tuple[int, str] | None] = [None] * len(choices)
        try:
            if w.chat:
                for i in range(len(choices)):
                    yield w.role(i)
            item = first
            while item is not None:
                i, resp = item
                if trace is not None:
                    trace.stamp("INFER_RESPONSE_COMPLETE")
                text = choices[i].add(resp)
                chunk = None
                if resp.final:
                    end = ends[i] = self._end(choices[i], max_tokens, echo)
                    chunk = w.delta(i, text, end[1])
                elif text:
                    chunk = w.delta(i, text, None)
                if chunk is not None:
                    if trace is None:
                        yield chunk
                    else:
                        trace.stamp("HTTP_SEND_START")
                        yield chunk
                        trace.stamp("HTTP_SEND_END")
                item = await anext(stream, None)
            if s.include_usage:
                done = [
                    e or self._end(c, max_tokens, echo) for c, e in zip(choices, ends, strict=True)
                ]
                usage = self._usage(choices, done, s.n)
                yield w.usage(usage["prompt_tokens"], usage["completion_tokens"])
            yield codec.DONE
        except Exception as exc:
            status, message = http_error(exc, "an OpenAI-compatible stream")
            yield w.error(status, message)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
            if trace is not None:
                trace.finish()

    # ------------------------------------------------------------------ embeddings
    async def embeddings(self, body: bytes, guard: Guard, recv_ns: int) -> Reply:
        req = parse_embedding(body)
        conv = await self._convention(req.model)
        if conv is None or conv.kind != EMBEDDING:
            raise FieldError(
                "model",
                f"model '{req.model}' does not answer embeddings: it does not follow vLLM's "
                "embedding convention (an input 'embedding_request', answered in 'text_output')",
            )
        requests = [embedding_request(conv, req.model, x, req.dimensions) for x in req.inputs]
        choices = [_Choice(x if isinstance(x, str) else "") for x in req.inputs]
        trace = self._sample(req.model, recv_ns, requests[0])
        try:
            await guard(self._drain(_merged(self.service, requests), choices))
            if trace is not None:
                trace.stamp("INFER_RESPONSE_COMPLETE")
            vectors = [self._vector(c, req.model, req.dimensions) for c in choices]
        except BaseException:
            if trace is not None:
                trace.finish()
            raise
        prompt = 0
        for c, item in zip(choices, req.inputs, strict=True):
            if c.prompt_tokens is not None:
                prompt += c.prompt_tokens
            else:
                prompt += len(item) if isinstance(item, list) else self.chat.count(item)
        usage = {"prompt_tokens": prompt, "total_tokens": prompt}
        doc = codec.embedding_body(req.model, vectors, req.encoding_format, usage)
        return Reply(doc=doc, trace=trace)

    @staticmethod
    def _vector(c: _Choice, model: str, dimensions: int | None) -> list[float]:
        vector = embedding_vector("".join(c.parts), model)
        if dimensions is not None and len(vector) != dimensions:
            raise Internal(
                f"model '{model}' answered {len(vector)} dimensions where the request asked "
                f"for {dimensions}"
            )
        return vector
