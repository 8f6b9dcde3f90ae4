"""The local engine: greedy generation on one llama.cpp model, its KV cache and its sampling.

`Engine` serves one `ChatRequest` at a time. It renders the prompt with `runner.chat_adapter`
(ChatML with the tools, one segment per message), keeps the KV entries of leading segments the
previous request shared (and the first segment's from disk, `runner.kvprefix`), evaluates the
rest, then generates greedily (temperature 0, `GreedySampler`): free text watched for a call,
or under the grammar `runner.chat_adapter` builds for the request's ``tool_choice``; text the
call grammar forces is evaluated as one batch (jump-forward); with drafting, tokens found
earlier in the context are verified a batch at a time (`Feeder`). It yields `runner.chat_adapter`'s events
(`TextDelta`, `CallDelta`, `Finished`), which `runner.local_app` shapes as OpenAI replies.

Rendering, parsing and grammars are `runner.chat_adapter`'s; this module only drives llama.cpp.
"""

from __future__ import annotations

import codecs
import ctypes
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from runner.chat_adapter import (
    CALL_CLOSE,
    CALL_OPEN,
    MAX_CALLS_PER_TURN,
    STOP_STRINGS,
    CallForcer,
    Event,
    Finished,
    JsonObject,
    ReplySplitter,
    RequestError,
    TextDelta,
    ToolChoice,
    call_grammar,
    count_prior_calls,
    default_system_prompt,
    finished_calls,
    no_call_grammar,
    offered_tool_names,
    parse_tool_choice,
    render_segments,
    text_format_grammar,
    untagged_call_grammar,
    untagged_start,
)

if TYPE_CHECKING:
    from llama_cpp import Llama

    from runner.kvprefix import PrefixStore

DEFAULT_MAX_TOKENS = 512
"""Reply cap when a request sets none, tokens."""
DEFAULT_DRAFT_TOKENS = 4
"""Most tokens drafted at a time (speculative decoding)."""
LOOKUP_NGRAMS = (3, 2)
"""Prompt lookup: the lengths of the context's last n-gram looked for earlier, longest first."""
DraftKind = Literal["none", "lookup"]


class ContextOverflow(RequestError):
    """The rendered prompt does not fit the context window.

    Attributes:
        n_prompt_tokens: the prompt's tokens. n_ctx: the context window, tokens.
    """

    def __init__(self, n_prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(f"This model's maximum context length is {n_ctx} tokens; "
                         f"the prompt has {n_prompt_tokens} tokens")
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


@dataclass
class ChatRequest:
    """What the engine needs from an OpenAI chat request (validated by `runner.local_app`).

    Attributes:
        messages: OpenAI messages, at least one.
        tools: OpenAI tool definitions (legacy ``functions`` already converted).
        tool_choice: as `parse_tool_choice` reads it.
        max_tokens: reply cap, tokens (None: the server's default).
        stop: extra stop strings.
        parallel_tool_calls: False: at most one call in the reply (OpenAI's
            ``parallel_tool_calls``); True: up to `MAX_CALLS_PER_TURN`.
        none_keeps_tools: under ``tool_choice`` none, keep the tools in the prompt (True) or
            leave them out (False); None: the engine's setting.
        grammar_tools: narrower definitions of some of `tools` (same names, tighter schemas)
            that this reply's calls must match; the prompt still shows `tools`, so the KV
            entries of the conversation so far are reused. Empty: the calls match `tools`.
        top_logprobs: None: no log probabilities; else each generated token's log probability
            under the model (before any grammar) with this many of the likeliest tokens beside
            it (OpenAI's ``logprobs`` and ``top_logprobs``).
        response_format: OpenAI's ``response_format``: with ``json_object`` or ``json_schema``, a
            reply that can call no tool is generated under that JSON's grammar.
    """

    messages: list[JsonObject]
    tools: list[JsonObject] = field(default_factory=list)
    tool_choice: Any = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    parallel_tool_calls: bool = True
    none_keeps_tools: bool | None = None
    grammar_tools: list[JsonObject] = field(default_factory=list)
    top_logprobs: int | None = None
    response_format: Any = None


def _callable(request: ChatRequest) -> list[JsonObject]:
    """The tools this reply's calls must match: `ChatRequest.tools`, each replaced by its
    `ChatRequest.grammar_tools` definition where the request gives one.

    Raises:
        RequestError: a grammar tool names no tool of the request.
    """
    narrower = {name: tool for name, tool in zip(offered_tool_names(request.grammar_tools), request.grammar_tools)}
    if unknown := sorted(set(narrower) - set(offered_tool_names(request.tools))):
        raise RequestError(f"grammar_tools names tools not in tools: {', '.join(unknown)}")
    return [narrower.get(name, tool) for name, tool in zip(offered_tool_names(request.tools), request.tools)]


@dataclass
class _Reply:
    """One reply while `Engine` generates it: what drives generation and what it has made so far.

    Attributes:
        splitter: turns the reply's text into events.
        sampler: greedy sampler, under whichever grammar applies now.
        forcer: finds text the call grammar forces (jump-forward).
        decoder: incremental UTF-8 decoder of the sampled tokens' bytes.
        tools: the tools in view. choice: the request's ``tool_choice``.
        header: the assistant header's tokens (the prompt's last segment).
        max_tokens: the reply cap, tokens. began: request start, `time.perf_counter()` s.
        text: the reply so far. tail: its last characters while watching for ``<tool_call>``.
        generated: tokens generated (sampled or forced). first_token_ms: request start to the
            first sampled token, ms (0 until then).
        finish: "length" until generation ends otherwise ("stop", "cancelled").
        inject: forced text to evaluate next, "" for none.
        held: the reply's opening held back while it may be an untagged call, else None.
        held_tokens: the tokens of `held`.
        watching: free text watched for the model writing ``<tool_call>`` (tool_choice auto).
        calling: the reply is under a call grammar (required, or since it opened a call).
        blank_refused: times the greedy token would have left the reply empty and was refused.
        more_calls_chosen: times end of turn, the likeliest token after a finished call, was
            refused because the model gave another call more probability (`_end_refused`).
        call_probability: under ``tool_choice`` auto, the probability the model gave opening a
            call as the reply's first visible token (`_start_refused`); None when not measured.
        logprobs: with `ChatRequest.top_logprobs`, one OpenAI ``logprobs.content`` entry per
            sampled token, else None. top_logprobs: the likeliest tokens each entry lists.
    """

    splitter: ReplySplitter
    sampler: GreedySampler
    forcer: CallForcer
    decoder: codecs.IncrementalDecoder
    tools: list[JsonObject]
    choice: ToolChoice
    header: list[int]
    max_tokens: int
    began: float
    text: str = ""
    tail: str = ""
    generated: int = 0
    first_token_ms: float = 0.0
    finish: str = "length"
    inject: str = ""
    held: str | None = None
    held_tokens: list[int] = field(default_factory=list)
    watching: bool = False
    calling: bool = False
    max_calls: int = MAX_CALLS_PER_TURN
    blank_refused: int = 0
    more_calls_chosen: int = 0
    call_probability: float | None = None
    logprobs: list[JsonObject] | None = None
    top_logprobs: int = 0
    scored: int = 0
    format_kept: bool | None = None


def _scored(reply: _Reply, events: Iterator[Event]) -> Iterator[Event]:
    """`events` with each `TextDelta` carrying the log probability entries of the tokens its
    text completes, counted by characters of the content so far (which leaves out the reply's
    leading whitespace); `reply.scored` is how many entries went out."""
    shown = taken = 0  # characters of content sent, and of the tokens' text given out (leading whitespace aside)
    for event in events:
        if isinstance(event, TextDelta) and reply.logprobs is not None:
            shown += len(event.text)
            start = reply.scored
            while reply.scored < len(reply.logprobs):
                token = reply.logprobs[reply.scored]["token"]
                more = taken + len(token if taken else token.lstrip())
                if more > shown:
                    break
                taken, reply.scored = more, reply.scored + 1
            event = TextDelta(event.text, reply.logprobs[start:reply.scored])
        yield event


_SCHEMA_ERRORS = (AssertionError, ValueError, KeyError, TypeError, AttributeError)
"""What llama-cpp-python's schema converter raises for a schema it cannot follow."""


def _bad_schema(tools: list[JsonObject], exc: Exception) -> RequestError:
    """The 400 for `tools` whose call grammar could not be built (`exc`), naming the first tool
    whose parameters are no JSON schema object, or one the grammar cannot follow."""
    for tool in tools:
        name = offered_tool_names([tool])[0]
        if not isinstance(tool.get("function", {}).get("parameters", {}), dict):
            return RequestError(f"tools: the parameters of {name!r} are not a JSON schema object")
        try:
            call_grammar([tool])
        except _SCHEMA_ERRORS as alone:
            return RequestError(f"tools: the parameter schema of {name!r} is one the call grammar cannot follow "
                                f"({alone})")
    return RequestError(f"tools: a call grammar for them cannot be built ({exc})")


class Engine:
    """Greedy chat generation on one `Llama`, one request at a time.

    KV reuse, message by message: the prompt is tokenized per segment (`render_segments`) and
    evaluated one segment per ``Llama.eval`` call. Leading segments identical to the previous
    request's are kept in the KV cache; the rest, and always the final assistant header, are
    evaluated again. Every token's KV entries and the first token's logits therefore come from
    the same batch composition whether the server is fresh or warm, so a fresh and a warm
    server give byte-identical replies (llama.cpp's batched and single-token kernels round
    differently; reusing a prefix that ends mid-message, as llama-cpp-python does, changed the
    first reply of a warm server). Generated tokens are never reused: the next request
    re-evaluates the assistant message as a prompt segment.

    A reply is never empty: while it shows nothing yet, a token that would end it or add only
    whitespace is not sampled (`_refused`); the next best token is.

    Args:
        llama: the loaded model.
        default_max_tokens: reply cap when a request sets none, tokens.
        reuse_prefix: False evaluates every prompt in full (for measuring what reuse saves).
        jump_forward: evaluate text the call grammar forces as one batch (`CallForcer`);
            False samples it token by token (for measuring what that saves).
        untagged_calls: with ``tool_choice`` auto, a reply that starts with a JSON object (bare,
            fenced or in doubled braces) is a call (`untagged_start`): generation rewinds to the
            reply's start and writes it again under `untagged_call_grammar`. For models that
            write calls without the ``<tool_call>`` tag (Qwen2.5-Coder); the manifest says which.
        check_first: greedy sampling under a grammar tries the best token alone first
            (`GreedySampler`), and an untagged call's opening the call grammar allows is kept
            instead of written again (`_hold`); False: the grammar over the whole vocabulary
            every token, and every untagged call rewound.
        none_keeps_tools: ``tool_choice`` none keeps the tools in the prompt (the KV cache of the
            conversation is reused) and rules calls out by grammar; False hides them, as runner
            did before (every token after the system prompt is evaluated again).
        draft: "lookup" drafts tokens by prompt lookup and verifies them in one batch (`Feeder`);
            "none" evaluates one generated token at a time.
        draft_tokens: most tokens drafted at a time.
        stop_at_call_end: end a reply as soon as it holds all the calls it may make
            (``parallel_tool_calls``): the closing tag and end of turn the grammar leaves are
            neither sampled nor evaluated (the same calls, fewer decodes); False generates them.
        another_call_by_mass: after a finished call, when more calls are allowed, end of turn
            is weighed against another call by probability mass, not by the single likeliest
            token (`_end_refused`); False: plain greedy.
        call_threshold: under ``tool_choice`` auto, a reply opens a call only when the model
            gives that at least this probability among the visible first tokens
            (`_start_refused`); None: greedy decides.

    `prefix_store`, when set, gives a cold engine the first segment's KV entries from disk
    (`runner.kvprefix`): loaded when no segment is reused from memory, saved when it was
    evaluated into an empty cache.
    """

    prefix_store: PrefixStore | None = None
    _disk_prefix: list[int] | None = None
    """The first segment as loaded from disk, while its KV entries are in the cache."""
    _disk_tokens = 0

    def __init__(self, llama: Llama, default_max_tokens: int = DEFAULT_MAX_TOKENS,
                 reuse_prefix: bool = True, jump_forward: bool = True, untagged_calls: bool = False,
                 check_first: bool = True, none_keeps_tools: bool = True, draft: DraftKind = "none",
                 draft_tokens: int = DEFAULT_DRAFT_TOKENS, stop_at_call_end: bool = True,
                 another_call_by_mass: bool = True, call_threshold: float | None = None) -> None:
        import llama_cpp

        self.llama = llama
        self.default_max_tokens = default_max_tokens
        self.reuse_prefix = reuse_prefix
        self.jump_forward = jump_forward
        self.untagged_calls = untagged_calls
        self.check_first = check_first
        self.none_keeps_tools = none_keeps_tools
        self.keep_untagged_opening = check_first
        self.stop_at_call_end = stop_at_call_end
        self.another_call_by_mass = another_call_by_mass
        self.call_threshold = call_threshold
        self.feeder = Feeder(llama, draft, draft_tokens)
        self._lock = threading.Lock()
        self._segments: list[list[int]] = []
        self._blank: Any = None
        self._eog: Any = None
        self._call_openers: Any = None
        self._default_system = default_system_prompt(llama.metadata.get("tokenizer.chat_template"))
        self._vocab = llama._model.vocab
        self._is_eog = llama_cpp.llama_vocab_is_eog
        self._add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def tokens(self, text: str) -> int:
        """Token count of `text` in this model's tokenizer (no BOS, special tokens parsed)."""
        return len(self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def stream(self, request: ChatRequest, cancel: threading.Event) -> Iterator[Event]:
        """Generate one reply as events: `TextDelta`/`CallDelta` as tokens arrive, then `Finished`.

        Waits for the previous request to finish first. Setting `cancel` stops generation
        within one token (finish_reason "cancelled"). Close the iterator when abandoning it.

        `Finished.timings`: prompt_tokens; cached_prompt_tokens (KV entries reused);
        prompt_eval_tokens (evaluated) and prompt_eval_ms; eval_tokens (generated) and
        eval_ms (sampling and decodes); first_token_ms (request start to the first generated
        token); handler_ms (whole call, lock wait excluded); prefix_disk_tokens; dropped_call;
        duplicate_calls (calls left out as repeats of an earlier call of the reply); blank_refused
        (greedy tokens refused because they would have left the reply empty, `_refused`);
        with drafting, draft_proposed and draft_accepted (tokens drafted, and confirmed).

        Raises:
            RequestError: bad tool_choice or tools; ContextOverflow when the prompt does not fit.
        """
        names = offered_tool_names(request.tools)
        choice = parse_tool_choice(request.tool_choice, names)
        # Under "none" the tools stay in the prompt, where every other turn has them, so the
        # conversation's KV entries are reused; a grammar rules the call out instead
        # (`no_call_grammar`).
        tools = _callable(request) if choice.mode != "none" else []
        if tools:  # built now, not once a call opens mid-reply: a schema it cannot follow is a 400
            try:
                call_grammar(tools, choice.name)
            except _SCHEMA_ERRORS as exc:
                raise _bad_schema(tools, exc) from exc
        keeps_tools = self.none_keeps_tools if request.none_keeps_tools is None else request.none_keeps_tools
        shown = request.tools if keeps_tools else tools
        # With the tools hidden (none_keeps_tools off) only a model that writes untagged calls
        # is held to prose, as before.
        prose_only = choice.mode == "none" and bool(request.tools) and (bool(shown) or self.untagged_calls)
        text_format = text_format_grammar(request.response_format)
        segments = render_segments(request.messages, shown, self._default_system)
        with self._lock:
            yield from self._generate(request, choice, tools, segments, cancel, prose_only, text_format)

    def _generate(self, request: ChatRequest, choice: ToolChoice, tools: list[JsonObject],
                  segments: list[str], cancel: threading.Event, prose_only: bool = False,
                  text_format: str | None = None) -> Iterator[Event]:
        """Evaluate the prompt, then generate the reply as events ending with `Finished`.

        Args:
            request: the request being served.
            choice: its checked ``tool_choice``.
            tools: the tools the reply may call (none under ``tool_choice`` none, where they are
                still in the prompt).
            segments: the rendered prompt, one string per turn (`render_segments`).
            cancel: set to stop generation within one token.
            prose_only: generate under `no_call_grammar` (see `stream`).
            text_format: the GBNF grammar ``response_format`` asks a reply in words to follow
                (`text_format_grammar`); it applies when no tool can be called.

        Raises:
            ContextOverflow: the prompt leaves no room for a reply token.
        """
        began = time.perf_counter()
        seg_tokens = [self.llama.tokenize(s.encode("utf-8"), add_bos=self._add_bos and i == 0, special=True)
                      for i, s in enumerate(segments)]
        prompt_tokens = sum(len(s) for s in seg_tokens)
        # llama.cpp rounds a context up (to at least 256 tokens), llama-cpp-python keeps room
        # for the n_ctx it was asked for: the smaller is what fits
        n_ctx = min(self.llama.n_ctx(), len(self.llama.input_ids))
        room = n_ctx - prompt_tokens
        if room < 1:
            raise ContextOverflow(prompt_tokens, n_ctx)
        max_tokens = min(request.max_tokens or self.default_max_tokens, room)
        cached = self._load_prompt(seg_tokens)
        self.feeder.start_reply(max_tokens)
        prompt_done = time.perf_counter()
        reply = self._start_reply(request, choice, tools, prose_only, max_tokens, seg_tokens[-1], began)
        if text_format is not None:
            reply.format_kept = not tools
            if not tools:
                reply.sampler = self._grammar_sampler(text_format)
        yield from _scored(reply, self._reply_events(reply, cancel))
        yield self._finished(reply, prompt_tokens, cached, prompt_done)

    def _reply_events(self, reply: _Reply, cancel: threading.Event) -> Iterator[Event]:
        """The reply's text and call events, generated."""
        yield from self._decode(reply, cancel)
        yield from self._release_held(reply)  # a reply that ended while still undecided is text
        yield from reply.splitter.finish()

    def _start_reply(self, request: ChatRequest, choice: ToolChoice, tools: list[JsonObject],
                     prose_only: bool, max_tokens: int, header: list[int], began: float) -> _Reply:
        """The state of a reply about to be generated: its sampler, splitter and forced text.

        Args:
            request, choice, tools, prose_only: as for `_generate`.
            max_tokens: the reply cap, tokens (already fitted to the context window).
            header: the assistant header's tokens (the prompt's last segment).
            began: `time.perf_counter()` when the request started, s.
        """
        splitter = ReplySplitter(offered_tool_names(tools), count_prior_calls(request.messages),
                                 [*STOP_STRINGS, *request.stop], calls_allowed=bool(tools))
        # auto: free text, watched for the opening tag; required/named: the grammar from token 1.
        watching = bool(tools) and choice.mode == "auto"
        constrained = bool(tools) and choice.mode in ("required", "named")
        calls = MAX_CALLS_PER_TURN if request.parallel_tool_calls else 1
        sampler = (self._grammar_sampler(no_call_grammar(self.untagged_calls)) if prose_only
                   else self._sampler(tools, choice if constrained else None, calls))
        return _Reply(
            splitter=splitter,
            sampler=sampler,
            forcer=CallForcer(tools if self.jump_forward else [], choice.name),
            decoder=codecs.getincrementaldecoder("utf-8")(errors="replace"),
            tools=tools,
            choice=choice,
            header=header,
            max_tokens=max_tokens,
            began=began,
            inject=CALL_OPEN if constrained else "",
            # Untagged calls: the reply's opening is held back until `untagged_start` decides.
            held="" if watching and self.untagged_calls else None,
            watching=watching,
            calling=constrained,
            max_calls=MAX_CALLS_PER_TURN if request.parallel_tool_calls else 1,
            logprobs=None if request.top_logprobs is None else [],
            top_logprobs=request.top_logprobs or 0,
        )

    def _decode(self, reply: _Reply, cancel: threading.Event) -> Iterator[Event]:
        """Generate until end of turn, a stop string, `cancel` or max_tokens; sets `reply.finish`."""
        while reply.generated < reply.max_tokens:
            if cancel.is_set():
                reply.finish = "cancelled"
                return
            reply.inject = reply.inject or reply.forcer.forced(reply.text)
            if reply.inject:
                yield from self._jump_forward(reply)
                if self._calls_done(reply):
                    reply.finish = "stop"
                    return
                continue
            refused = self._refused(reply)
            token = reply.sampler.sample(self.llama._ctx, self.feeder.row, refused)
            if refused is not None and refused is self._eog:
                reply.more_calls_chosen += reply.sampler.refused_best
            else:
                reply.blank_refused += reply.sampler.refused_best
            if self._is_eog(self._vocab, token):
                reply.finish = "stop"
                return
            reply.first_token_ms = reply.first_token_ms or (time.perf_counter() - reply.began) * 1000
            if reply.logprobs is not None:
                reply.logprobs.append(self._logprob_entry(token, reply.top_logprobs))
            piece = reply.decoder.decode(self.llama.detokenize([token], special=True))
            if self._hold(reply, token, piece):
                continue
            yield from self._release_held(reply)
            opened = (reply.tail + piece).find(CALL_OPEN) if reply.watching else -1
            if opened >= 0:
                yield from self._open_call(reply, token, piece, opened)
                continue
            yield from self._emit(reply, token, piece)
            if reply.splitter.stopped or self._calls_done(reply):
                reply.finish = "stop"
                return

    def _logprob_entry(self, token: int, top: int) -> JsonObject:
        """OpenAI's ``logprobs.content`` entry for `token`, sampled from the current row: its
        log probability under the model's own distribution and the `top` likeliest tokens'."""
        import llama_cpp
        import numpy as np

        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llama._ctx.ctx, self.feeder.row),
                                       shape=(self.llama.n_vocab(),)).astype(np.float64)
        logits -= logits.max()
        logprobs = logits - np.log(np.exp(logits).sum())
        best = np.argpartition(-logprobs, top)[:top] if top else np.array([], dtype=int)

        def entry(t: int) -> JsonObject:
            raw = self.llama.detokenize([t], special=True)
            return {"token": raw.decode("utf-8", errors="replace"), "logprob": round(float(logprobs[t]), 6),
                    "bytes": list(raw)}

        return entry(token) | {"top_logprobs": [entry(int(t)) for t in sorted(best, key=lambda t: -logprobs[t])]}

    def _refused(self, reply: _Reply) -> Any:
        """While the reply shows nothing yet (no text but whitespace, no call begun), the tokens
        that would leave it empty: end of turn, control tokens and whitespace (`blank_tokens`),
        as a boolean mask over the vocabulary; afterwards None. A reply therefore always holds
        prose or a call, even where greedy decoding would end the turn at once (a small model's
        habit right after tool results)."""
        if not (reply.text + (reply.held or "")).strip():
            return self._start_refused(reply)
        return self._end_refused(reply)

    def _start_refused(self, reply: _Reply) -> Any:
        """The first visible token's refusals: blank tokens always (`blank_tokens`); under
        ``tool_choice`` auto the probability of opening a call (``<``, ``{`` or a fence) among
        the visible tokens is kept in `reply.call_probability`, and with `call_threshold` a
        call the model gives less than that is refused as well: the reply is prose."""
        blank = self.blank_tokens()
        if not reply.watching or reply.call_probability is not None:
            return blank
        _, openers = self._boundary_masks()
        probabilities = self._probabilities()
        visible = float(probabilities[~blank].sum())
        calls = float(probabilities[openers & ~blank].sum())
        reply.call_probability = calls / visible if visible > 0 else 0.0
        if self.call_threshold is not None and reply.call_probability < self.call_threshold:
            return blank | openers
        return blank

    def _end_refused(self, reply: _Reply) -> Any:
        """Right after a finished call, when the reply may make more: end of turn against another
        call, each by the probability mass the model gives it. Greedy decoding compares single
        tokens, and the model's wish to go on is spread over several (a newline, two newlines, the
        opening tag, a brace…), most of which the call grammar may not even allow, while end of
        turn is one token: a question that asks for four calls got one. When the tokens that lead
        to another call (blank ones, ``<tool_call>``, an opening brace or fence) outweigh the
        end-of-generation tokens, those are refused (a boolean mask) and the grammar's best
        continuation is sampled; otherwise None."""
        if not (self.another_call_by_mass and reply.calling and reply.max_calls > 1):
            return None
        text = reply.text.rstrip()
        if not text.endswith(("}", CALL_CLOSE)) or not 0 < finished_calls(reply.text) < reply.max_calls:
            return None
        eog, openers = self._boundary_masks()
        probabilities = self._probabilities()
        return eog if float(probabilities[openers].sum()) > float(probabilities[eog].sum()) else None

    def _probabilities(self) -> Any:
        """The model's next-token distribution at the current row (numpy, sums to 1)."""
        import llama_cpp
        import numpy as np

        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llama._ctx.ctx, self.feeder.row),
                                       shape=(self.llama.n_vocab(),)).astype(np.float64)
        weights = np.exp(logits - logits.max())
        return weights / weights.sum()

    def _boundary_masks(self) -> tuple[Any, Any]:
        """Boolean masks over the vocabulary: end-of-generation tokens, and the tokens that lead
        from a finished call to another (blank, or opening with ``<``, ``{`` or a fence). Built
        on first use, then kept."""
        if self._eog is None:
            import numpy as np

            eog = np.zeros(self.llama.n_vocab(), dtype=bool)
            openers = np.zeros(self.llama.n_vocab(), dtype=bool)
            blank = self.blank_tokens()
            for token in range(len(eog)):
                eog[token] = self._is_eog(self._vocab, token)
                text = self.llama.detokenize([token], special=True).decode("utf-8", errors="replace")
                openers[token] = not eog[token] and (text.lstrip().startswith(("<", "{", "```"))
                                                     or (bool(blank[token]) and text.strip() == "" and text != ""))
            self._eog, self._call_openers = eog, openers
        return self._eog, self._call_openers

    def blank_tokens(self) -> Any:
        """A boolean mask over the vocabulary (numpy), True for each token that adds nothing
        visible: end of generation, control tokens, whitespace. Built on first use (about
        0.5 s for a 150,000-token vocabulary), then kept."""
        if self._blank is None:
            import llama_cpp
            import numpy as np

            blank = np.zeros(self.llama.n_vocab(), dtype=bool)
            for token in range(len(blank)):
                blank[token] = (self._is_eog(self._vocab, token) or llama_cpp.llama_vocab_is_control(self._vocab, token)
                                or not self.llama.detokenize([token], special=True).strip())
            self._blank = blank
        return self._blank

    def _jump_forward(self, reply: _Reply) -> Iterator[Event]:
        """Evaluate `reply.inject`, text the grammar allows in one way only, as one batch.

        The text is cut to the tokens left under max_tokens; the sampler accepts each token so
        its grammar state follows.
        """
        whole = self._tokenize(reply.inject)
        tokens = whole[: reply.max_tokens - reply.generated]
        piece = reply.inject if tokens == whole else self.llama.detokenize(tokens, special=True).decode("utf-8", "replace")
        for forced in tokens:
            reply.sampler.accept(forced)
        reply.generated += len(tokens)
        reply.text += piece
        reply.inject = ""
        if not self._calls_done(reply):
            self.feeder.feed(tokens)
        yield from reply.splitter.feed(piece)

    def _hold(self, reply: _Reply, token: int, piece: str) -> bool:
        """Hold back the reply's opening while `untagged_start` cannot tell whether it is a call.

        Returns:
            True when the token was dealt with here: the opening is still undecided (the token
            is evaluated and held), or it is an untagged call: generation goes on under
            `untagged_call_grammar`, from here when the grammar allows the opening as written
            (greedy choices the grammar allows are the greedy choices under it, so the tokens
            are those a rewind would give), else from the reply's start. False when nothing is
            held (any more): the reply is text and the token goes on as usual, after
            `_release_held`.
        """
        if reply.held is None:
            return False
        verdict = untagged_start(reply.held + piece)
        if verdict == "text":
            return False
        reply.generated += 1
        if verdict == "undecided":
            reply.held += piece
            reply.held_tokens.append(token)
            self.feeder.feed([token])
            return True
        sampler = self._untagged_sampler(reply.tools, reply.max_calls)
        reply.splitter.start_untagged()
        if self.keep_untagged_opening and sampler.follows([*reply.held_tokens, token]):
            opening = reply.held + piece
            reply.text += opening
            reply.splitter.feed(opening)
            if reply.generated < reply.max_tokens:
                self.feeder.feed([token])
        else:
            self._rewind_reply(reply.header)
            reply.decoder.reset()
            sampler = self._untagged_sampler(reply.tools, reply.max_calls)
        reply.sampler = sampler
        reply.held, reply.held_tokens, reply.watching, reply.calling = None, [], False, True
        return True

    def _calls_done(self, reply: _Reply) -> bool:
        """With `stop_at_call_end`, whether a reply under a call grammar holds every call it may
        make (`finished_calls`): all the grammar leaves is the closing tag and end of turn."""
        return self.stop_at_call_end and reply.calling and finished_calls(reply.text) >= reply.max_calls

    @staticmethod
    def _closing(reply: _Reply) -> str:
        """The text that closes the finished calls: the tag of a tagged call still open, the
        fence of a fenced untagged block, else none."""
        opened = reply.text.rfind(CALL_OPEN)
        if opened >= 0:
            return "" if CALL_CLOSE in reply.text[opened:] else "\n" + CALL_CLOSE
        return "\n```" if reply.text.lstrip().startswith("```") else ""

    def _release_held(self, reply: _Reply) -> list[Event]:
        """Show the held opening as text (it was evaluated already) and stop holding."""
        earlier, reply.held = reply.held, None
        if not earlier:
            return []
        reply.text, reply.tail = reply.text + earlier, (reply.tail + earlier)[-len(CALL_OPEN):]
        return reply.splitter.feed(earlier)

    def _emit(self, reply: _Reply, token: int, piece: str) -> Iterator[Event]:
        """Add a sampled token's text to the reply; evaluate the token unless a stop string ended it."""
        reply.tail = (reply.tail + piece)[-len(CALL_OPEN):]
        reply.generated += 1
        reply.text += piece
        yield from reply.splitter.feed(piece)
        if self._calls_done(reply):
            closing = self._closing(reply)
            reply.text += closing
            yield from reply.splitter.feed(closing)
        elif not reply.splitter.stopped and reply.generated < reply.max_tokens:  # else no token follows
            self.feeder.feed([token])

    def _open_call(self, reply: _Reply, token: int, piece: str, opened: int) -> Iterator[Event]:
        """The model wrote ``<tool_call>`` (ending `opened` characters into tail + piece): keep
        the text up to the tag's end (a token may run past it), then hand the rest of the turn
        to the call grammar."""
        head = piece[: opened + len(CALL_OPEN) - len(reply.tail)]
        replacement = [token] if head == piece else self._tokenize(head)
        reply.generated += len(replacement)
        reply.text += head
        yield from reply.splitter.feed(head)
        self.feeder.feed(replacement)
        reply.watching, reply.tail, reply.calling = False, "", True
        reply.sampler = self._sampler(reply.tools, reply.choice, reply.max_calls, after_open=True)

    def _finished(self, reply: _Reply, prompt_tokens: int, cached: int, prompt_done: float) -> Finished:
        """The reply's `Finished` event, with the timings `stream` documents.

        Args:
            reply: the reply, fully generated.
            prompt_tokens: the prompt's tokens. cached: those whose KV entries were reused.
            prompt_done: `time.perf_counter()` when the prompt was evaluated, s.
        """
        done = time.perf_counter()
        finish = "tool_calls" if reply.finish == "stop" and reply.splitter.calls else reply.finish
        logprobs = None if reply.logprobs is None else reply.logprobs[:reply.scored] if reply.splitter.calls \
            else reply.logprobs
        return Finished(finish, prompt_tokens, reply.generated, logprobs=logprobs, timings={
            "prompt_tokens": prompt_tokens,
            "cached_prompt_tokens": cached,
            "prompt_eval_tokens": prompt_tokens - cached,
            "prompt_eval_ms": round((prompt_done - reply.began) * 1000, 3),
            "eval_tokens": reply.generated,
            "eval_ms": round((done - prompt_done) * 1000, 3),
            "first_token_ms": round(reply.first_token_ms, 3),
            "prefix_disk_tokens": self._disk_tokens,
            **({"draft_proposed": self.feeder.proposed, "draft_accepted": self.feeder.accepted}
               if self.feeder.draft != "none" else {}),
            "handler_ms": round((done - reply.began) * 1000, 3),
            "dropped_call": reply.splitter.dropped_call,
            "duplicate_calls": reply.splitter.duplicates,
            "blank_refused": reply.blank_refused,
            "more_calls_chosen": reply.more_calls_chosen,
            **({} if reply.call_probability is None else {"call_probability": round(reply.call_probability, 4)}),
            **({} if reply.format_kept is None else
               {"response_format": "followed" if reply.format_kept else "not enforced: tools could be called"}),
        })

    def _load_prompt(self, seg_tokens: list[list[int]]) -> int:
        """Evaluate the prompt segment by segment, keeping matching leading segments; returns
        the number of prompt tokens whose KV entries were reused."""
        keep = 0
        limit = min(len(self._segments), len(seg_tokens) - 1) if self.reuse_prefix else 0  # header: always
        while keep < limit and self._segments[keep] == seg_tokens[keep]:
            keep += 1
        if keep == 0 and self.reuse_prefix and len(seg_tokens) > 1:
            keep = self._restore_prefix(seg_tokens[0])
        self._disk_tokens = len(seg_tokens[0]) if keep and seg_tokens[0] == self._disk_prefix else 0
        self._segments = seg_tokens[:keep]
        cached = sum(len(s) for s in self._segments)
        self.llama.n_tokens = cached  # eval() drops every KV entry from here on
        for segment in seg_tokens[keep:]:
            self.llama.eval(segment)
            self._segments.append(segment)
            if len(self._segments) == 1 and len(seg_tokens) > 1:
                self._disk_prefix = None
                self._save_prefix(segment)
        return cached

    def warm_up(self) -> None:
        """Get a cold engine ready before its first request, as llama.cpp's own server does:
        one throwaway decode (the model's weights are read in, buffers allocated), then an
        empty cache again, and the mask of `blank_tokens` built; then, with a prefix store, its most recently used saved prefix
        is loaded as if the previous request had left it."""
        self.llama.n_tokens = 0
        self.llama.eval(self._tokenize("<|im_start|>"))
        self.llama.n_tokens = 0
        self.llama._ctx.kv_cache_seq_rm(-1, 0, -1)
        self._segments = []
        self.blank_tokens()
        tokens = self.prefix_store.latest() if self.prefix_store is not None and self.reuse_prefix else None
        if tokens and self._restore_prefix(tokens):
            self._segments = [tokens]

    def _restore_prefix(self, tokens: list[int]) -> int:
        """1 if the prefix store loaded `tokens`' KV entries (the first segment), else 0."""
        if self.prefix_store is None or not self.prefix_store.restore(self.llama, tokens):
            return 0
        self._disk_prefix = tokens
        return 1

    def _save_prefix(self, tokens: list[int]) -> None:
        if self.prefix_store is not None and self.reuse_prefix:
            self.prefix_store.save(self.llama, tokens)

    def _rewind_reply(self, header: list[int]) -> None:
        """Forget the tokens generated so far: drop their KV entries and evaluate the assistant
        header again as its own batch, as `_load_prompt` does, so the next token is sampled from
        the very logits the reply's first token was (the reply is rewritten under a grammar)."""
        self.llama.n_tokens = sum(len(s) for s in self._segments) - len(header)
        self.feeder.rewind()
        self.llama.eval(header)

    def _grammar_sampler(self, grammar: str | None) -> GreedySampler:
        """Greedy sampling under the GBNF `grammar` (None: free text) from the reply's next token."""
        return GreedySampler(self.llama, grammar, self.check_first)

    def _untagged_sampler(self, tools: list[JsonObject], calls: int) -> GreedySampler:
        """Greedy sampling under `untagged_call_grammar` from the reply's first token."""
        return self._grammar_sampler(untagged_call_grammar(tools, calls))

    def _tokenize(self, text: str) -> list[int]:
        return self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def _sampler(self, tools: list[JsonObject], choice: ToolChoice | None, calls: int = MAX_CALLS_PER_TURN,
                 after_open: bool = False) -> GreedySampler:
        """Greedy sampling, under the call grammar (at most `calls` calls with ``tool_choice``
        auto) unless `choice` is None (free text)."""
        if choice is None or choice.mode == "none" or not tools:
            return self._grammar_sampler(None)
        calls = calls if choice.mode == "auto" else 1
        return self._grammar_sampler(call_grammar(tools, choice.name, calls=calls, after_open=after_open))


class GreedySampler:
    """The greedy choice of each next token, under a llama.cpp grammar or free.

    What llama.cpp's sampler chain "grammar, then greedy" picks, sooner: with `check_first`, the
    highest-scoring token of the whole vocabulary is tried against the grammar alone, and only
    when the grammar refuses it are the grammar's rules applied to every token (llama.cpp's own
    ``common_sampler_sample`` does the same). A token the grammar allows that scores highest over
    the whole vocabulary also scores highest among the tokens the grammar allows, and ties go to
    the lowest token id either way, so the tokens are the same; a permissive grammar (prose) no
    longer walks ~150,000 token strings per generated token.

    Args:
        llama: the model (its vocabulary and context).
        grammar: GBNF text with a ``root`` rule, or None for free text.
        check_first: try the best token alone first (False: apply the grammar to the whole
            vocabulary every time, as llama.cpp's sampler chain does).
    """

    def __init__(self, llama: Llama, grammar: str | None, check_first: bool = True) -> None:
        import llama_cpp
        import numpy as np

        self._np, self._llama_cpp = np, llama_cpp
        self._n_vocab = llama.n_vocab()
        self._grammar = (llama_cpp.llama_sampler_init_grammar(llama._model.vocab, grammar.encode(), b"root")
                         if grammar is not None else None)
        self.check_first = check_first
        self._one = (llama_cpp.llama_token_data * 1)()
        self._one_array = llama_cpp.llama_token_data_array(data=self._one, size=1, selected=-1, sorted=False)
        self._all: Any = None
        self.full_applications = 0
        """Times the grammar was applied to the whole vocabulary (for measuring)."""
        self.refused_best = False
        """The last `sample` refused the best-scoring token (it was in `refused`)."""

    def sample(self, ctx: Any, idx: int = -1, refused: Any = None) -> int:
        """The greedy token from the logits of batch row `idx` (-1: the last), accepted by the
        grammar; ``ctx`` is llama-cpp-python's ``LlamaContext``. `refused`: a boolean mask over
        the vocabulary of tokens not to pick, or None."""
        np = self._np
        logits = np.ctypeslib.as_array(self._llama_cpp.llama_get_logits_ith(ctx.ctx, idx), shape=(self._n_vocab,))
        self.refused_best = refused is not None and bool(refused[int(np.argmax(logits))])
        if self.refused_best:
            logits = np.where(refused, -np.inf, logits).astype(np.float32)
        token = int(np.argmax(logits))
        if self._grammar is not None:
            if not (self.check_first and self._allows(token, float(logits[token]))):
                token = self._constrained(logits)
            self._llama_cpp.llama_sampler_accept(self._grammar, token)
        return token

    def follows(self, tokens: list[int]) -> bool:
        """Advance the grammar over `tokens` if it allows each in turn; False at the first it
        refuses (the grammar's state is then past some of them: use another sampler)."""
        for token in tokens:
            if self._grammar is not None and not self._allows(token, 0.0):
                return False
            self.accept(token)
        return True

    def accept(self, token: int) -> None:
        """Advance the grammar over `token` (text evaluated without sampling: forced text)."""
        if self._grammar is not None:
            self._llama_cpp.llama_sampler_accept(self._grammar, token)

    def _allows(self, token: int, logit: float) -> bool:
        one: Any = self._one[0]
        one.id, one.logit, one.p = token, logit, 0.0
        self._one_array.size, self._one_array.selected, self._one_array.sorted = 1, -1, False
        self._llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(self._one_array))
        return bool(self._np.isfinite(self._one[0].logit))

    def _constrained(self, logits: Any) -> int:
        """The highest-scoring token the grammar allows (the whole vocabulary checked)."""
        from llama_cpp._internals import LlamaTokenDataArray

        if self._all is None:
            self._all = LlamaTokenDataArray(n_vocab=self._n_vocab)
        self._all.copy_logits(logits)
        self._llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(self._all.candidates))
        self.full_applications += 1
        return int(self._np.argmax(self._all.candidates_data.logit))

    def __del__(self) -> None:
        grammar, self._grammar = getattr(self, "_grammar", None), None
        if grammar is not None:
            self._llama_cpp.llama_sampler_free(grammar)


class Feeder:
    """Evaluates the tokens a reply adds, and drafts the ones it may add next (speculative decoding).

    Without drafting, each token is evaluated as it comes. With ``draft="lookup"`` (prompt lookup
    decoding), a sampled token goes into llama.cpp with up to `draft_tokens` tokens that followed
    the context's last n-gram where it occurred before (`LOOKUP_NGRAMS`: a path or a name copied
    from a tool result, the rest of a call's keys), in one batch with logits for every row. The
    engine samples the next token greedily from the row after the token it fed; while its choice
    equals the next drafted token, that token is already in the KV cache and the next row is
    ready, so no decode is needed. At the first choice that differs, the drafted entries after it
    are dropped. `row` is the batch row to sample from; `proposed` and `accepted` count drafted
    tokens in the current reply.

    llama.cpp's CPU kernels for a batch of several tokens may round differently from those for
    one token (measured on Qwen2.5-Coder-1.5B: logits up to 0.4 apart), so a reply decoded with
    drafts can differ from one decoded token by token where two tokens score almost alike.
    """

    def __init__(self, llama: Llama, draft: DraftKind = "none", draft_tokens: int = DEFAULT_DRAFT_TOKENS) -> None:
        self.llama = llama
        self.draft = draft
        self.draft_tokens = draft_tokens
        self.row = -1
        self.pending: list[int] = []
        self.proposed = 0
        self.accepted = 0
        self.left = 0
        """Tokens the reply may still add (drafts past it would be wasted)."""

    def start_reply(self, max_tokens: int) -> None:
        """A reply starts (its prompt just evaluated by ``Llama.eval``); `max_tokens`: its cap."""
        self.pending, self.row, self.left, self.proposed, self.accepted = [], -1, max_tokens, 0, 0

    def rewind(self) -> None:
        """Forget the drafts: the caller is about to move back in the KV cache and evaluate again."""
        self.pending, self.row = [], -1

    def feed(self, tokens: list[int]) -> None:
        """Add `tokens` to the reply's KV entries: those a draft already put there are taken as
        they are; the rest are evaluated, a single sampled token with fresh drafts after it."""
        self.left -= len(tokens)
        taken = 0
        while taken < len(tokens) and taken < len(self.pending) and tokens[taken] == self.pending[taken]:
            taken += 1
        if taken:
            self._commit(tokens[:taken])
            self.pending = self.pending[taken:]
            self.row += taken
            self.accepted += taken
        rest = tokens[taken:]
        if not rest:
            return
        self.pending = []
        drafts = self._lookup(rest) if self.draft == "lookup" else []
        if not drafts:
            self.llama.eval(rest)
            self.row = -1
            return
        self._decode([*rest, *drafts], first_logits=len(rest) - 1)
        self._commit(rest)
        self.pending, self.row = drafts, len(rest) - 1
        self.proposed += len(drafts)

    def _commit(self, tokens: list[int]) -> None:
        """Record `tokens`, already in the KV cache, as the model's next tokens."""
        n = self.llama.n_tokens
        self.llama.input_ids[n: n + len(tokens)] = tokens
        self.llama.n_tokens = n + len(tokens)

    def _decode(self, tokens: list[int], first_logits: int) -> None:
        """One llama.cpp decode of `tokens` after the committed ones, logits from row `first_logits` on."""
        llama = self.llama
        n_past = llama.n_tokens
        batch: Any = llama._batch.batch
        batch.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, n_past + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= first_logits
        llama._ctx.kv_cache_seq_rm(-1, n_past, -1)
        llama._ctx.decode(llama._batch)

    def _lookup(self, tokens: list[int]) -> list[int]:
        """Up to `draft_tokens` tokens that followed the most recent earlier occurrence of the
        context's last n-gram (the committed tokens, then `tokens`), longest n-gram first."""
        import numpy as np

        n_past = self.llama.n_tokens
        room = min(self.draft_tokens, self.left, len(self.llama.input_ids) - n_past - len(tokens),
                   self.llama.n_batch - len(tokens))
        if room < 1:
            return []
        context = np.concatenate([self.llama.input_ids[:n_past], np.asarray(tokens, dtype=self.llama.input_ids.dtype)])
        for n in LOOKUP_NGRAMS:
            if len(context) <= n:
                continue
            tail = context[-n:]
            windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                return [int(t) for t in context[start: start + room]]
        return []
