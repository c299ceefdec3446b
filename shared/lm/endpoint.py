"""Endpoint models: an OpenAI-compatible server (vLLM, TGI, a provider's API) answering
``/v1/completions`` or ``/v1/chat/completions``, called by every worker under one rate limit.
Besides generations it reads log-likelihoods of token sequences the way lm-eval's
``local-completions`` does: ``/v1/completions`` with the tokens as the prompt, ``echo`` and
``logprobs`` (:meth:`EndpointModel.loglikelihoods`), through the same limit, cache and budget.

A batch's requests go out concurrently (httpx's async client) with a timeout each. Before each
request the fleet-wide limiter (:class:`evalq.shared.store.rate.RateLimit`) admits it or says how
long to wait; within a worker process the number in flight adapts to the server (additive increase,
multiplicative decrease on each 429: :class:`Gate`). A 429, a 5xx, a timeout, a lost connection
or an unreadable answer is retried after an exponential backoff with full jitter, or after the
server's ``Retry-After``; a request whose retries run out ends its sample with an
:class:`EndpointError` of its kind (``endpoint/RateLimited``, ``endpoint/Timeout``, …), and the
batch goes on. Another 4xx is not retried (the request itself is wrong). A run with a token
budget holds each try's worst case before it is sent and is charged its usage when it returns
(:class:`Meter`); a request the budget cannot take ends its sample
:class:`evalq.shared.errors.TokensExhausted`, unsent.

The API key is read from the worker's environment variable the endpoint's policy entry names
(:class:`evalq.shared.lm.limits.EndpointLimits`; none when it names none), sent in the
``Authorization`` header and nowhere else. Error lines hold no text the server chose: its status
code and phrase, or a fixed reason (:data:`_UNREADABLE`, an exception's class name), never its
body or an exception message built from its bytes. A server can echo the key transformed
(base64, reversed, split across fields, lower-cased, JSON-escaped), which no scrubbing of the key
can catch, so what it says is not passed on at all. The limiter and the key come from the caller
(:func:`evalq.shared.evals.language.endpoint_model`), so this module needs no store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import httpx

from evalq.shared.errors import (
    BadResponse,
    EndpointError,
    OverReported,
    PermanentError,
    RateLimited,
    Refused,
    ServerError,
    Timeout,
    TokensExhausted,
    TooLarge,
    Unreachable,
    first_line,
)
from evalq.shared.lm.answer import Unreadable, error_kind, read_body, status_line, unreadable
from evalq.shared.lm.backoff import BACKOFF_CAP, Gate, backoff, retry_after
from evalq.shared.lm.request import (
    PROMPT_OVERHEAD,
    Generation,
    GenerationRequest,
    Loglikelihood,
    LoglikelihoodRequest,
    Prompt,
    cut_at_stop,
)
from evalq.shared.lm.spec import ModelArgs, ModelSpec
from evalq.shared.lm.template import Messages

__all__ = [
    "ENVELOPE_BYTES",
    "BadResponse",
    "EndpointError",
    "EndpointModel",
    "Limiter",
    "Meter",
    "OverReported",
    "RateLimited",
    "Refused",
    "Responses",
    "ServerError",
    "Timeout",
    "TooLarge",
    "Unreachable",
    "request_digest",
]

MAX_BODY = 4 << 20
"""The largest answer read (bytes): a longer one is a bad response, never held whole."""
ENVELOPE_BYTES = 64 << 10
"""What an answer may hold beyond its text (its JSON, usage, ids): an answer longer than an
output may be plus this is :class:`TooLarge`."""
_HEADER_SAFE = re.compile(r"^[\x21-\x7e]+$")
_WAIT_FOR_ANSWER = 0.05
"""Seconds before the first look again for an answer another request for the same prompt is
getting; doubled after each look, up to :data:`_WAIT_CAP` (a waiting message of 64 samples
looked 1,280 times a second at first)."""
_WAIT_CAP = 1.0
_ASK_MODELS = 5.0
"""Seconds a server's ``/models`` may take to answer (the cache's key waits for it)."""
_SILENT_FOR = 60.0
"""Seconds a server whose ``/models`` said nothing is not asked again (per process)."""
_WAIT_FOR_TOKENS = 0.2
"""Seconds between two asks for tokens that requests in flight hold."""


class Limiter(Protocol):
    """The fleet-wide rate limit of an endpoint (:class:`evalq.shared.store.rate.RateLimit`)."""

    def refresh(self, args: ModelArgs) -> str | None: ...
    def take(self, tokens: int) -> float: ...
    def adjust(self, tokens: int) -> None: ...
    def pause(self, seconds: float) -> None: ...
    def count(self, **counts: int) -> None: ...


class Meter(Protocol):
    """A run's token budget (:class:`evalq.shared.store.spend.RunMeter`)."""

    def hold(self, tokens: int, seconds: float) -> str | None: ...
    def charge(self, ticket: str, used: int) -> None: ...


class Responses(Protocol):
    """The fleet's response cache (:class:`evalq.shared.store.responses.ResponseCache`)."""

    def get(self, digest: str) -> dict[str, Any] | None: ...
    def claim(self, digest: str, seconds: float) -> bool: ...
    def put(self, digest: str, answer: dict[str, Any]) -> None: ...
    def release(self, digest: str) -> None: ...


def request_digest(
    endpoint: str, body: dict[str, Any], served: str | None = None, principal: str = ""
) -> str:
    """The response cache's key for a request ``body`` (which names its model) to ``endpoint``,
    whose ``/models`` said the model is ``served`` (its weights' ``root``, when it says), asked
    for a run of ``principal``: whatever decides the answer, and whose cache it is. A hit says
    that the same prompt was asked before, so one principal's hits must never come from
    another's requests (the security review read another user's 30 chosen sample ids off
    ``usage.cached``); each principal has a cache of its own."""
    key = {"endpoint": endpoint, "body": body, "served": served, "principal": principal}
    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


Failure = EndpointError | TokensExhausted
"""Why a request has no answer: its retries ran out, or its run's token budget did."""
Request = GenerationRequest | LoglikelihoodRequest
Answer = Generation | Loglikelihood


@dataclass
class _Try:
    """What one try came to: an answer, or an error and how long the server asked to wait."""

    answer: Answer | None = None
    error: EndpointError | None = None
    retry_after: float | None = None
    unanswered: bool = False
    """The request may have been served though no usage came back (a timeout, a connection
    lost after it was sent, an unreadable answer): a token budget charges its worst case."""


class EndpointModel:
    """One endpoint model of one worker process; build with :meth:`load`."""

    def __init__(
        self,
        spec: ModelSpec,
        rate: Limiter,
        key: str | None,
        cache: Responses | None = None,
        *,
        meters: Callable[[str], Meter | None] | None = None,
        owners: Callable[[str], str] | None = None,
        max_body: int = MAX_BODY,
    ) -> None:
        """``max_body``: the longest answer read (bytes; a longer one is :class:`TooLarge`)."""
        if spec.endpoint is None:
            raise PermanentError(f"model {spec}: not an endpoint model")
        key = key.strip() if key else None
        if key and not _HEADER_SAFE.match(key):
            raise PermanentError(
                f"the key of {spec.endpoint} holds characters an HTTP header cannot carry "
                "(spaces, control characters or non-ASCII)"
            )
        self.spec = spec
        self.url = spec.endpoint
        self._max_body = min(max_body, MAX_BODY)
        self.rate = rate
        self._key = key or None
        self._rng = random.Random()
        self.cache = cache
        """Where answers are shared (``submit --cache``); None: every request is made."""
        self._meters = meters
        self._owners = owners
        self._silent: float | None = None
        """When :meth:`_served` last heard no version (None: it heard one)."""

    @property
    def _headers(self) -> dict[str, str]:
        """The key, as every request to the server carries it (none when unset)."""
        return {"Authorization": f"Bearer {self._key}"} if self._key else {}

    def meter(self, run_id: str) -> Meter | None:
        """The token budget run ``run_id``'s requests are charged to (None: not metered)."""
        return self._meters(run_id) if self._meters is not None and run_id else None

    def owner(self, run_id: str) -> str:
        """The principal of run ``run_id``, whose response cache its requests use ("": none
        known)."""
        return self._owners(run_id) if self._owners is not None and run_id else ""

    def render(self, prompt: str, *, chat: bool, system: str | None = None) -> Prompt:
        """What is sent: ``prompt`` as text (after ``system`` and a blank line) for
        ``/completions``, or as chat messages for ``/chat/completions`` (the server applies
        its model's template): :class:`evalq.shared.lm.template.Messages`, the one rendering
        the views show, too."""
        return Messages().render(prompt, chat=chat, system=system)

    def generate(
        self, requests: Sequence[GenerationRequest], runs: Sequence[str] | None = None
    ) -> list[Generation | Failure]:
        """Each request's generation, or the error its retries ended with, in order, each
        metered by its run's token budget and answered from its run's principal's response
        cache (``runs``: each request's run; None: no run, neither); every request refused
        when the endpoint is no longer listed as the run named it (the policy's limits are
        read again for each batch)."""
        return cast("list[Generation | Failure]", self._all(requests, runs))

    def loglikelihoods(
        self,
        requests: Sequence[LoglikelihoodRequest],
        runs: Sequence[str] | None = None,
        within: float | None = None,
    ) -> list[Loglikelihood | Failure]:
        """Each request's continuation log-likelihood, or the error its retries ended with,
        metered, cached and refused as :meth:`generate`'s are; ``within``: the seconds the
        whole batch may take, waits for the rate limit included (None: unbounded), after
        which each request is a :class:`Timeout`."""
        return cast("list[Loglikelihood | Failure]", self._all(requests, runs, within))

    def _all(
        self, requests: Sequence[Request], runs: Sequence[str] | None, within: float | None = None
    ) -> list[Answer | Failure]:
        """Each request's answer (of its own kind: a generation for a generation request), or
        its failure, in order."""
        refused = self.rate.refresh(self.spec.args)
        if refused is not None:
            return [Refused(refused) for _ in requests]
        asked = self._ask_all(requests, runs or [""] * len(requests))
        try:
            return asyncio.run(asyncio.wait_for(asked, within))
        except TimeoutError:
            late = Timeout(f"no answer from {self.url} within {within}s (rate limit included)")
            return [late for _ in requests]

    async def _ask_all(
        self, requests: Sequence[Request], runs: Sequence[str]
    ) -> list[Answer | Failure]:
        limits = httpx.Limits(max_connections=self.spec.args.concurrency)
        timeout = httpx.Timeout(self.spec.args.timeout)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
            served = await self._served(http) if self.cache is not None else None
            asked = (self._one(http, r, run, served) for r, run in zip(requests, runs, strict=True))
            return list(await asyncio.gather(*asked))

    async def _served(self, http: httpx.AsyncClient) -> str | None:
        """What the server's ``/models`` says the model is (vLLM: the ``root`` its weights were
        loaded from), for the cache's key: another model served under the same name gets no
        hit. Asked once per batch, within :data:`_ASK_MODELS` seconds and :data:`MAX_BODY`
        bytes; None when it says nothing (or cannot be asked), and then not asked again for
        :data:`_SILENT_FOR` seconds (a server that hangs there delays no more batches)."""
        now = time.monotonic()
        if self._silent is not None and now - self._silent < _SILENT_FOR:
            return None
        root: str | None = None
        try:
            async with asyncio.timeout(min(_ASK_MODELS, self.spec.args.timeout)):
                async with http.stream("GET", self.url + "/models", headers=self._headers) as got:
                    raw = await read_body(got, MAX_BODY)
            if len(raw) > MAX_BODY:
                raise ValueError("an answer too long")
            entries = json.loads(raw).get("data", []) if got.status_code == 200 else []
            for entry in entries:
                if entry.get("id") == self.spec.name and isinstance(entry.get("root"), str):
                    root = entry["root"]
        except Exception:  # whatever the answer holds, or none: no version
            root = None
        self._silent = now if root is None else None
        return root

    async def _one(
        self,
        http: httpx.AsyncClient,
        request: Request,
        run: str,
        served: str | None = None,
    ) -> Answer | Failure:
        """The request's answer: from its run's principal's cache when that holds it (charged
        nothing), else asked (once for all the identical requests in flight) and kept. The
        asker's claim lasts one try and the longest wait before the next (a worker killed
        mid-request left claims of the whole patience, 510 s by default, which every waiter
        polled out), and a waiter looks less often the longer it waits."""
        meter = self.meter(run)
        gate = Gate.of(self.url, self.owner(run))
        if self.cache is None:
            return await self._asked(http, request, meter, gate)
        digest = request_digest(self.url, self._body(request), served, self.owner(run))
        retries = self.spec.args.max_retries
        patience = self.spec.args.timeout * (retries + 1) + BACKOFF_CAP * retries
        deadline = time.monotonic() + patience
        held_for = min(patience, self.spec.args.timeout + BACKOFF_CAP)  # one try and a wait
        claimed = False
        wait = _WAIT_FOR_ANSWER
        while True:
            hit = self.cache.get(digest)
            if hit is not None:
                self.rate.count(cached=1)
                return _from_cache(request, hit)
            claimed = self.cache.claim(digest, held_for)
            if claimed or time.monotonic() > deadline:
                break
            await asyncio.sleep(wait)
            wait = min(_WAIT_CAP, 2 * wait)
        try:
            made = await self._asked(http, request, meter, gate)
        except BaseException:
            if claimed:  # a waiter asks for itself rather than wait for the lock to lapse
                self.cache.release(digest)
            raise
        if isinstance(made, Generation | Loglikelihood):
            self.cache.put(digest, _to_cache(made))
        elif claimed:
            self.cache.release(digest)
        return made

    async def _asked(
        self, http: httpx.AsyncClient, request: Request, meter: Meter | None, gate: Gate
    ) -> Answer | Failure:
        """The request made, with retries, under the fleet's limit, this worker's ``gate`` (its
        principal's) and its run's token budget."""
        attempt = 0
        while True:
            async with gate.entered(self.spec.args.concurrency):
                estimate = request.estimated_tokens()
                await self._admitted(estimate)
                try:
                    tried = await self._metered(http, request, meter)
                except TokensExhausted as exc:
                    return exc
                throttled = isinstance(tried.error, RateLimited)
                if tried.answer is not None:
                    gate.succeeded()
                elif throttled:
                    gate.throttled()
            if tried.answer is not None:
                used = tried.answer.prompt_tokens + tried.answer.completion_tokens
                self.rate.adjust(used - estimate)
                self.rate.count(requests=1, tokens=used)
                return tried.answer
            error = tried.error or BadResponse("no answer")
            if tried.retry_after:  # the server's word holds for the whole fleet
                self.rate.pause(tried.retry_after)
            if not error.retryable or attempt >= self.spec.args.max_retries:
                self.rate.count(requests=1, rate_limited=int(throttled), failed=1)
                note = f" (after {attempt + 1} tries)" if error.retryable else ""
                return type(error)(f"{first_line(error)}{note}")
            self.rate.count(requests=1, rate_limited=int(throttled), retries=1)
            wait = tried.retry_after
            await asyncio.sleep(wait if wait is not None else backoff(attempt, self._rng))
            attempt += 1

    async def _metered(
        self, http: httpx.AsyncClient, request: Request, meter: Meter | None
    ) -> _Try:
        """One try, its worst case held on the run's token budget before it is sent and its
        usage charged when it returns (raises :class:`TokensExhausted`, nothing sent, when
        the budget cannot take it)."""
        if meter is None:
            return await self._try(http, request)
        worst = request.worst_tokens()
        ticket = await self._held(meter, worst)
        used = worst  # unless the try says otherwise: it may have been served (or cancelled)
        try:
            tried = await self._try(http, request)
            if tried.answer is not None:
                used = tried.answer.prompt_tokens + tried.answer.completion_tokens
            elif not tried.unanswered:
                used = 0  # refused with a status: nothing was generated
            return tried
        finally:
            meter.charge(ticket, used)

    async def _held(self, meter: Meter, tokens: int) -> str:
        """A hold of ``tokens`` on the run's budget, waiting while requests in flight hold
        what could make room (for as long as their holds may live, twice over)."""
        timeout = self.spec.args.timeout
        patience = 2 * (timeout + BACKOFF_CAP)
        deadline = time.monotonic() + patience
        while (ticket := meter.hold(tokens, timeout)) is None:
            if time.monotonic() > deadline:
                raise TokensExhausted(
                    f"the token budget's last tokens were held by requests in flight for over "
                    f"{patience:.0f}s; not sent"
                )
            await asyncio.sleep(_WAIT_FOR_TOKENS + self._rng.uniform(0.0, _WAIT_FOR_TOKENS))
        return ticket

    async def _admitted(self, tokens: int) -> None:
        """Wait until the fleet's limiter admits a request of ``tokens`` tokens."""
        while (wait := self.rate.take(tokens)) > 0:
            await asyncio.sleep(wait + self._rng.uniform(0.0, min(wait, 0.05)))

    async def _try(self, http: httpx.AsyncClient, request: Request) -> _Try:
        """One try: the request sent and its answer read (at most :data:`MAX_BODY` bytes),
        all within the timeout."""
        chat = isinstance(request, GenerationRequest) and not isinstance(request.prompt, str)
        path = "/chat/completions" if chat else "/completions"
        body = self._body(request)
        try:
            async with asyncio.timeout(self.spec.args.timeout):
                posted = http.stream("POST", self.url + path, json=body, headers=self._headers)
                async with posted as got:
                    status, retry = got.status_code, got.headers.get("retry-after")
                    raw = await read_body(got, self._max_body)
        except httpx.ConnectError as exc:  # never sent
            return _Try(error=Unreachable(f"{self.url}: could not connect ({error_kind(exc)})"))
        except (TimeoutError, httpx.TimeoutException) as exc:
            waited = self.spec.args.timeout
            sent = not isinstance(exc, httpx.ConnectTimeout)
            late = Timeout(f"no answer from {self.url} within {waited}s")
            return _Try(error=late, unanswered=sent)
        except httpx.HTTPError as exc:  # its message may quote the server's bytes
            lost = Unreachable(f"{self.url}: the connection failed ({error_kind(exc)})")
            return _Try(error=lost, unanswered=True)
        if status == 429:
            return _Try(
                error=RateLimited(f"{self.url} answered 429"), retry_after=retry_after(retry)
            )
        if status >= 500:
            wait = retry_after(retry)
            return _Try(error=ServerError(f"{self.url} answered {status}"), retry_after=wait)
        if 300 <= status < 400:
            return _Try(error=Refused(f"{self.url} answered {status}: redirects are not followed"))
        if status >= 400:  # the body is the server's to choose: not passed on
            return _Try(error=Refused(f"{self.url} answered {status_line(status)}"))
        if len(raw) > self._max_body:
            big = TooLarge(
                f"{self.url}: an answer over {self._max_body} bytes, longer than an output may "
                "be (EVALQ_MAX_OUTPUT_BYTES)"
            )
            return _Try(error=big, unanswered=True)
        return self._read(raw, request, chat)

    def _body(self, request: Request) -> dict[str, Any]:
        if isinstance(request, LoglikelihoodRequest):  # lm-eval's local-completions' payload
            return {
                "model": self.spec.name,
                "prompt": list(request.tokens),
                "max_tokens": 1,
                "temperature": 0,
                "logprobs": 1,
                "echo": True,
            }
        body: dict[str, Any] = {
            "model": self.spec.name,
            "max_tokens": request.max_new_tokens,
            "temperature": request.temperature,
        }
        if request.temperature > 0:  # greedy answers do not depend on it (nor their cache key)
            body["seed"] = request.seed
        if request.top_p < 1.0:
            body["top_p"] = request.top_p
        if request.stop:
            body["stop"] = list(request.stop)
        if isinstance(request.prompt, str):
            body["prompt"] = request.prompt
        else:
            body["messages"] = [{"role": r, "content": c} for r, c in request.prompt]
        return body

    def _read(self, raw: bytes, request: Request, chat: bool) -> _Try:
        """The answer an answer holds (a generation's text, or an echoed log-likelihood:
        :func:`_text`, :func:`_scored`) and its usage, or why it is a bad one (any shape, any
        depth, a usage past what the request can use)."""
        try:
            data = json.loads(raw)
            if isinstance(request, LoglikelihoodRequest):
                logprob, greedy = _scored(data["choices"][0]["logprobs"], request)
            else:
                text = _text(data["choices"][0], chat)
            prompt_tokens, completion_tokens = _usage(data["usage"])
        except Exception as exc:  # RecursionError, UnicodeError, …: whatever the answer holds
            error = BadResponse(f"{self.url}: an unreadable answer ({unreadable(exc)})")
            return _Try(error=error, unanswered=True)
        over = self._overreported(request, prompt_tokens, completion_tokens)
        if over is not None:
            return _Try(error=over, unanswered=True)
        if isinstance(request, LoglikelihoodRequest):  # its tokens were sent: never fewer
            read = max(prompt_tokens, len(request.tokens))
            return _Try(answer=Loglikelihood(logprob, greedy, read, completion_tokens))
        text = cut_at_stop(text, request.stop)
        return _Try(answer=Generation(text, prompt_tokens, completion_tokens))

    def _overreported(
        self, request: Request, prompt_tokens: int, completion_tokens: int
    ) -> OverReported | None:
        """Why an answer's usage is not believed (more than the request can use), or None."""
        limit = request.max_new_tokens if isinstance(request, GenerationRequest) else 1
        most = (request.most_prompt_tokens(), limit)
        for what, count, bound in zip(
            ("prompt", "completion"), (prompt_tokens, completion_tokens), most, strict=True
        ):
            if count > bound:
                return OverReported(
                    f"{self.url} reported {count} {what} tokens; this request can use at most "
                    f"{bound} (its prompt's bytes and {PROMPT_OVERHEAD} a message, or its "
                    "max_new_tokens)"
                )
        return None


def _text(choice: Any, chat: bool) -> str:
    """A generation's text: the chat message's content, or the completion's."""
    text = choice["message"]["content"] if chat else choice["text"]
    if not isinstance(text, str):
        raise TypeError("the text is not a string")
    text.encode("utf-8")  # a lone surrogate could not be stored
    return text


def _scored(logprobs: Any, request: LoglikelihoodRequest) -> tuple[float, bool]:
    """The continuation's log-likelihood an echoed answer's ``logprobs`` hold, read as
    lm-eval's ``local-completions`` reads it: each continuation token's ``token_logprobs``
    summed; greedy when each is its position's best ``top_logprobs``."""
    n = len(request.tokens)
    values, tops = logprobs["token_logprobs"], logprobs["top_logprobs"]
    if not (isinstance(values, list) and isinstance(tops, list)):
        raise Unreadable("no log-probabilities")
    if len(values) not in (n, n + 1) or len(tops) != len(values):
        raise Unreadable("log-probabilities of another number of tokens than sent")
    scored = [_logprob(v) for v in values[request.context_length : n]]
    best = [max(_logprob(v) for v in top.values()) for top in tops[request.context_length : n]]
    total = math.fsum(scored)  # -1e308 twice: OverflowError, a bad response like any other
    if not math.isfinite(total):
        raise Unreadable("a log-likelihood that is not finite")
    return total, all(v == b for v, b in zip(scored, best, strict=True))


def _usage(usage: Any) -> tuple[int, int]:
    """An answer's prompt and completion token counts, each a count."""
    counts = usage["prompt_tokens"], usage["completion_tokens"]
    for count in counts:
        if type(count) is not int or count < 0:
            raise Unreadable("a token count that is not a count")
    return counts


def _logprob(value: Any) -> float:
    """A log-probability from an answer: a finite float, at most 0."""
    if type(value) not in (int, float) or not math.isfinite(value) or value > 0:
        raise Unreadable("a log-probability that is not one")
    return float(value)


def _to_cache(made: Answer) -> dict[str, Any]:
    """What the response cache keeps of an answer (all but ``cached``)."""
    kept = dataclasses.asdict(made)
    del kept["cached"]
    return kept


def _from_cache(request: Request, hit: dict[str, Any]) -> Answer:
    """A cached answer to ``request`` (answers of two kinds never share a key: their bodies
    differ)."""
    if isinstance(request, LoglikelihoodRequest):
        return Loglikelihood(
            float(hit["logprob"]),
            bool(hit["is_greedy"]),
            int(hit["prompt_tokens"]),
            int(hit["completion_tokens"]),
            cached=True,
        )
    return Generation(
        str(hit["text"]), int(hit["prompt_tokens"]), int(hit["completion_tokens"]), cached=True
    )
