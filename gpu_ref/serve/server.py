"""OpenAI-compatible HTTP server over :class:`gpu_ref.serve.Engine` (Python's ``http.server``, one thread
per connection; the engine steps in its own thread).

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(``stream: true``: server-sent events, ``data: {...}`` chunks then ``data: [DONE]``). Request fields:
``model`` (optional: must name the served model, by its id or another name it is served under), ``prompt``
(completions: a string or a list of token ids) or ``messages`` (chat: ``[{"role", "content"}]``, through the
tokenizer's chat template), ``max_tokens`` (default 16), ``temperature`` (default 1 as in the OpenAI API; 0
is greedy), ``top_p``, ``seed``, ``stop`` (a string or up to 4), ``stream``, ``stream_options``
(``{"include_usage": true}``: a last chunk with ``usage`` and no choices), ``n`` (1 only) and ``policy``
(optional: must be the served policy's spec or the name it was given by). The OpenAI fields this server does
not implement (:data:`UNSUPPORTED`: ``logprobs``, ``echo``, penalties, tools, ...) are accepted only at the
value that changes nothing; any other value is a 400 naming the field. Fields outside the API (and ``user``,
``metadata``, ``store``, ``service_tier``, which do not change the output) are ignored.

Errors: a JSON body ``{"error": {"message", "type", "param", "code"}}``; 400 for a malformed body or a bad
parameter (named in ``param``), 404 for an unknown path or model, 405 with ``Allow: GET, POST`` for any
other method (PUT, DELETE, ...), 408 for a body not received within ``body_timeout`` seconds, 413 for a body
over 1 MiB, 503 with ``Retry-After`` when the engine's queue is full. A client that disconnects (streaming
or not) cancels its request: its blocks return to the pool. A request that fits the pool but not its free
blocks waits (queued, FIFO); one that could never fit gets 400 naming ``prompt`` when the prompt and one new
token are over the context or the pool, else ``max_tokens``. No request can stop
the server or touch another request's cache (each running request owns its cache).
"""

from __future__ import annotations

import json
import queue
import select
import socket
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..cli import NO_CHAT_TEMPLATE, has_chat_template
from .engine import PoolFull, RequestError, SamplingParams

MAX_BODY = 1 << 20
#: seconds a handler waits for the engine's next token before giving up on the request
TOKEN_TIMEOUT = 600.0
#: seconds a request's body may take to arrive (default of ``OpenAIServer(body_timeout=)``)
BODY_TIMEOUT = 30.0
#: seconds a connection may stay silent (an idle keep-alive, a stalled header or write) before it is closed
IDLE_TIMEOUT = 120.0
#: seconds between checks that a waiting client is still connected
POLL = 0.25
#: the methods this server answers (the ``Allow`` header of the 405 any other method gets)
ALLOW = "GET, POST"

#: OpenAI request fields (and common extensions of other servers) this server does not implement -> the
#: values that change nothing (null is always accepted); any other value is a 400 naming the field
UNSUPPORTED = {
    "logprobs": (False,), "top_logprobs": (0,), "echo": (False,), "best_of": (1,), "suffix": ("",),
    "frequency_penalty": (0,), "presence_penalty": (0,), "logit_bias": ({},), "response_format": ({"type": "text"},),
    "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "modalities": (["text"],), "audio": (), "prediction": (), "reasoning_effort": (), "web_search_options": (),
    "top_k": (-1, 0), "min_p": (0,), "repetition_penalty": (1,), "min_tokens": (0,), "ignore_eos": (False,),
}


class HTTPError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind


def _usage(ids, req) -> dict:
    return {"prompt_tokens": len(ids), "completion_tokens": len(req.output), "total_tokens": len(ids) + len(req.output)}


def _stop_prefix(text: str, stop) -> int:
    """Length of the longest ending of ``text`` that is a proper prefix of a stop string."""
    n = 0
    for st in stop:
        for k in range(min(len(st) - 1, len(text)), n, -1):
            if text.endswith(st[:k]):
                n = k
                break
    return n


def _same(v, x) -> bool:
    """JSON equality that keeps booleans apart from numbers (``0`` is not ``false``)."""
    if isinstance(v, bool) or isinstance(x, bool):
        return v is x
    return v == x


def _field(body, name, types, default, what):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in types:
        raise HTTPError(400, f"'{name}' must be {what}, got {json.dumps(v)}", name)
    if not isinstance(v, types):
        raise HTTPError(400, f"'{name}' must be {what}, got {json.dumps(v)[:80]}", name)
    return v


class OpenAIServer(ThreadingHTTPServer):
    """The HTTP server. Args: ``engine`` (started here), ``tokenizer`` (``encode(text) -> ids``,
    ``decode(ids) -> str``, optional ``apply_chat_template``, ``eos_token_id``), ``model_name`` (the id
    clients pass as ``model``, in ``/v1/models`` and in responses), ``model_names`` (other names a request's
    ``model`` may use), ``policy_names`` (names a request's ``policy`` may use), ``address``."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = socket.SOMAXCONN        # listen backlog: a burst of clients is not dropped (socketserver: 5)

    def __init__(self, engine, tokenizer, model_name: str, address=("127.0.0.1", 8000), policy_names=(),
                 body_timeout: float = BODY_TIMEOUT, model_names=()):
        self.engine, self.tok, self.model_name = engine, tokenizer, model_name
        self.model_names = {model_name, *model_names}
        self.body_timeout = float(body_timeout)
        self.policy_names = {engine.policy.spec.lower(), *(p.lower() for p in policy_names)}
        self.created = int(time.time())
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
        super().__init__(address, _Handler)
        engine.start()

    def serve_in_thread(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="fwht-kv-http", daemon=True)
        t.start()
        return t

    def close(self):
        self.shutdown()
        self.server_close()
        self.engine.stop()

    # ------------------------------------------------------------------ request parsing
    def parse(self, body: dict, chat: bool):
        """A request body -> (prompt ids, SamplingParams, stop strings, stream, include_usage)."""
        for name, neutral in UNSUPPORTED.items():
            v = body.get(name)
            if v is not None and not any(_same(v, x) for x in neutral):
                what = f"only {' or '.join(json.dumps(x) for x in (None, *neutral))}" if neutral else "only null"
                raise HTTPError(400, f"'{name}' is not supported by this server ({what}), got "
                                     f"{json.dumps(v)[:80]}", name, "unsupported_parameter")
        model = body.get("model", self.model_name)
        if not isinstance(model, str) or model not in self.model_names:
            raise HTTPError(404, f"model {json.dumps(model)[:80]} is not served here; this server serves "
                                 f"{self.model_name!r} (GET /v1/models)", "model", "model_not_found")
        pol = body.get("policy")
        if pol is not None and (not isinstance(pol, str) or pol.lower() not in self.policy_names):
            raise HTTPError(400, f"policy {json.dumps(pol)[:80]} is not served here; this server runs the cache "
                                 f"policy {self.engine.policy.spec!r}", "policy", "policy_not_served")
        if _field(body, "n", (int,), 1, "1") != 1:
            raise HTTPError(400, "'n' must be 1 (one choice per request)", "n")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in msgs):
                raise HTTPError(400, "'messages' must be a non-empty list of {\"role\": str, \"content\": str}",
                                "messages")
            if not has_chat_template(self.tok):
                raise HTTPError(400, f"{NO_CHAT_TEMPLATE}: use /v1/completions", "messages", "no_chat_template")
            try:
                text = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            except Exception as err:
                raise HTTPError(400, f"'messages' cannot be rendered by the chat template: {err}", "messages")
            ids = self.tok.encode(text, add_special_tokens=False)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if isinstance(prompt, str):
                ids = self.tok.encode(prompt)
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                             for t in prompt):
                ids = prompt
            else:
                raise HTTPError(400, "'prompt' must be a non-empty string or a list of token ids", "prompt")
        if not len(ids):
            raise HTTPError(400, "the prompt encodes to no tokens", "prompt" if not chat else "messages")
        params = SamplingParams(
            max_tokens=_field(body, "max_tokens", (int,), 16, "an int >= 1")
            if "max_completion_tokens" not in body else _field(body, "max_completion_tokens", (int,), 16,
                                                               "an int >= 1"),
            temperature=_field(body, "temperature", (int, float), 1.0, "a number in [0, 100]"),
            top_p=_field(body, "top_p", (int, float), 1.0, "a number in (0, 1]"),
            seed=_field(body, "seed", (int,), None, "an int"),
            stop_token_ids=self.eos)
        stop = body.get("stop")
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
            raise HTTPError(400, "'stop' must be a non-empty string or a list of up to 4 of them", "stop")
        stream = _field(body, "stream", (bool,), False, "true or false")
        opts = _field(body, "stream_options", (dict,), {}, 'an object {"include_usage": bool}')
        if opts and not stream:
            raise HTTPError(400, "'stream_options' needs 'stream': true", "stream_options")
        if set(opts) - {"include_usage"} or not isinstance(opts.get("include_usage", False), bool):
            raise HTTPError(400, f"'stream_options' must be {{\"include_usage\": true or false}}, got "
                                 f"{json.dumps(opts)[:80]}", "stream_options")
        return list(ids), params, stop, stream, bool(opts.get("include_usage", False))


class _Handler(BaseHTTPRequestHandler):
    server: OpenAIServer
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT                       # the socket's timeout: a silent connection is closed

    def log_message(self, fmt, *args):          # quiet; the engine's stats are at /health
        pass

    # ------------------------------------------------------------------ plumbing
    def _send_json(self, status, obj, headers=()):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":                # a reply to HEAD has no body
            self.wfile.write(data)

    def _error(self, err: HTTPError, headers=()):
        headers = (*headers, ("Retry-After", "1")) if err.status == 503 else headers
        msg = err.message if len(err.message) <= 400 else err.message[:400] + "... (cut)"   # echoed values
        self._send_json(err.status, {"error": {"message": msg, "type": err.kind, "param": err.param,
                                               "code": err.code}}, headers)

    def send_error(self, code, message=None, explain=None):
        """http.server's own error replies in this server's JSON error shape: a method with no ``do_*`` here
        (its 501) is 405 ``method_not_allowed`` with ``Allow``, the request's body read and dropped so the
        connection goes on; a request line or header http.server cannot parse keeps its status and closes
        the connection."""
        headers = ()
        if code == HTTPStatus.NOT_IMPLEMENTED and self.command:
            err = HTTPError(405, f"method {self.command[:40]!r} is not allowed; this server answers {ALLOW}",
                            None, "method_not_allowed")
            headers = (("Allow", ALLOW),)
        else:
            self.close_connection = True
            phrase = self.responses.get(code, ("error",))[0]
            err = HTTPError(code, f"{phrase}: {message}" if message and message != phrase else phrase, None)
        try:
            if err.status == 405:
                self._body_discard()
            self._error(err, headers if not self.close_connection else (*headers, ("Connection", "close")))
        except OSError:
            self.close_connection = True

    def _body(self):
        n = self.headers.get("Content-Length")
        if n is None or not (n.isascii() and n.isdigit()):
            self.close_connection = True         # the body's end is unknown: never read it as a request
            raise HTTPError(411 if n is None else 400, "a Content-Length header is required" if n is None
                            else f"Content-Length must be a non-negative integer, got {n[:80]!r}", None)
        n = int(n) if len(n) <= 12 else MAX_BODY + 1
        if n > MAX_BODY:
            self.close_connection = True
            raise HTTPError(413, f"the body has {n} bytes; the limit is {MAX_BODY}", None)
        raw = self._read(n)
        try:
            body = json.loads(raw)
        except ValueError as err:           # JSONDecodeError, UnicodeDecodeError, integer digit limits
            raise HTTPError(400, f"the body is not valid JSON: {err}", None, "invalid_json") from None
        except RecursionError:
            raise HTTPError(400, "the body is not valid JSON: nested too deeply", None, "invalid_json") from None
        if not isinstance(body, dict):
            raise HTTPError(400, "the body must be a JSON object", None, "invalid_json")
        return body

    def _read(self, n: int) -> bytes:
        """``n`` body bytes, all of them within the server's ``body_timeout`` (a slow client gets 408 and
        its connection closed instead of holding the handler)."""
        limit = self.server.body_timeout
        deadline = time.monotonic() + limit
        parts, got = [], 0
        try:
            while got < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.connection.settimeout(left)
                chunk = self.rfile.read1(n - got)
                if not chunk:
                    self.close_connection = True
                    raise HTTPError(400, f"the body ended after {got} of its {n} bytes (Content-Length)", None)
                parts.append(chunk)
                got += len(chunk)
        except TimeoutError:
            self.close_connection = True
            raise HTTPError(408, f"the body did not arrive within {limit:g} s ({got} of {n} bytes)", None,
                            "body_timeout") from None
        finally:
            self.connection.settimeout(self.timeout)
        return b"".join(parts)

    def _client_gone(self) -> bool:
        """Whether the client closed its connection (EOF on the socket; pipelined bytes are not EOF)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # ------------------------------------------------------------------ routes
    def do_GET(self):
        s = self.server
        try:
            if self.path == "/health":
                return self._send_json(200, {"status": "ok", **s.engine.stats()})
            if self.path == "/v1/models":
                return self._send_json(200, {"object": "list", "data": [
                    {"id": s.model_name, "object": "model", "created": s.created, "owned_by": "fwht-kv",
                     "policy": s.engine.policy.spec}]})
            raise HTTPError(404, f"no route GET {self.path}", None, "not_found")
        except HTTPError as err:
            self._error(err)

    def do_POST(self):
        try:
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._body_discard()
                raise HTTPError(404, f"no route POST {self.path}", None, "not_found")
            chat = self.path == "/v1/chat/completions"
            body = self._body()
            ids, params, stop, stream, usage = self.server.parse(body, chat)
            try:
                req = self.server.engine.submit(ids, params)
            except RequestError as err:
                raise HTTPError(400, str(err), err.param)
            except PoolFull as err:
                raise HTTPError(503, str(err), None, "queue_full", "server_overloaded")
            self._respond(req, ids, stop, stream, chat, usage)
        except HTTPError as err:
            try:
                self._error(err)
            except OSError:
                self.close_connection = True
        except OSError:                                  # the client left (reset, broken pipe, write timeout)
            self.close_connection = True

    def _body_discard(self):
        """Read and drop a body this server does not use; one it cannot delimit or will not read (chunked, a
        bad or over-limit Content-Length) closes the connection instead: it is never read as a request."""
        n = self.headers.get("Content-Length")
        if n is None and self.headers.get("Transfer-Encoding") is None:
            return
        if (n and n.isascii() and n.isdigit() and len(n) <= 12 and int(n) <= MAX_BODY
                and self.headers.get("Transfer-Encoding") is None):
            self.rfile.read(int(n))
        else:
            self.close_connection = True

    # ------------------------------------------------------------------ responses
    def _events(self, req, stop):
        """Yields (text delta, finish_reason or None) per token event: the text of the tokens received so far
        (not of those the engine has made since; an incomplete character waits for the next token), the stop
        strings applied."""
        tok, engine = self.server.tok, self.server.engine
        text, sent, ids = "", 0, []
        checked = time.monotonic()
        while True:
            waited = 0.0
            while True:
                now = time.monotonic()
                if now - checked >= POLL:                # tokens flowing or not, a client that left is noticed
                    checked = now
                    if self._client_gone():              # nobody to answer: free the request's blocks
                        engine.cancel(req)
                        raise ConnectionResetError("the client closed the connection")
                try:
                    kind, val = req.events.get(timeout=POLL)
                    break
                except queue.Empty:
                    waited += POLL
                    if waited >= TOKEN_TIMEOUT:
                        engine.cancel(req)
                        yield "", "error"
                        return
            if kind == "error":
                yield "", "error"
                return
            finish = None
            if kind == "token":
                if val not in req.params.stop_token_ids:
                    ids.append(val)                      # the tokens of the events so far (the engine may be ahead)
                text = tok.decode(ids)
                hit = [text.find(s) for s in stop if s in text]
                if hit:
                    text = text[:min(hit)]
                    engine.cancel(req)
                    finish = "stop"
            else:
                finish = val
            if finish is None and text.endswith("\ufffd"):
                continue                                 # an incomplete character: wait for the next token
            # while running, hold back an ending that may start a stop string: it is sent once it cannot
            end = len(text) if finish is not None else max(sent, len(text) - _stop_prefix(text, stop))
            delta, sent = text[sent:end], end
            if finish is not None or delta:
                yield delta, finish
            if finish is not None:
                return

    def _respond(self, req, ids, stop, stream, chat, include_usage=False):
        s = self.server
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        obj = "chat.completion" if chat else "text_completion"
        created = int(time.time())
        if not stream:
            text, finish = "", None
            for delta, fin in self._events(req, stop):
                text += delta
                finish = fin
            if finish == "error":
                raise HTTPError(500, "the engine failed on this request", None, "engine_error", "server_error")
            choice = {"index": 0, "finish_reason": finish}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice.update(text=text, logprobs=None)
            return self._send_json(200, {"id": rid, "object": obj, "created": created, "model": s.model_name,
                                         "choices": [choice], "usage": _usage(ids, req)})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"

        def send(choice, **extra):
            msg = {"id": rid, "object": chunk_obj, "created": created, "model": s.model_name,
                   "choices": [] if choice is None else [choice], **extra}
            self.wfile.write(b"data: " + json.dumps(msg).encode() + b"\n\n")
            self.wfile.flush()
        try:
            if chat:
                send({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
            for delta, fin in self._events(req, stop):
                if chat:
                    send({"index": 0, "delta": {"content": delta} if delta else {}, "finish_reason": fin})
                else:
                    send({"index": 0, "text": delta, "logprobs": None, "finish_reason": fin})
            if include_usage:
                send(None, usage=_usage(ids, req))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except OSError:                                  # the client left (reset, broken pipe, write timeout)
            s.engine.cancel(req)                         # free its blocks
