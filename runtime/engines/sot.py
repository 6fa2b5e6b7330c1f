"""`sot`: prompted Skeleton-of-Thought (Ning et al. 2023) on a real pretrained chat model, no
training (the `skeleton` system uses PASTA's trained promise tokens instead).

1. Skeleton (phases `prefill`, `plan`): the model is asked, through its chat template, for a
   numbered outline of the answer (the paper's skeleton prompt) and decodes it greedily.
2. Parse: numbered points `1. ...`, `2. ...` (one per line or inline); an incomplete last point
   (the skeleton hit its token limit) is dropped.
3. Expansion (`prefill`, then `decode`): the conversation goes on with one more user turn per point
   ("continue point i only, in 1-2 sentences") and the assistant's answer opened with the point's
   own `i. title`. Every point's turn extends the same KV: the skeleton prompt and skeleton, and the
   part of the follow-up all points share, are in the store once (fed once); each point's own tail
   sees that shared prefix and itself only. All tails are prefilled in one pass and then every live
   point advances one token per pass, all points in one batched pass per step.
   A point stops at end-of-turn, at a newline (it would start another point) or at `point_max_tokens`.
4. A skeleton with fewer than 2 parsable points falls back to sequential decoding of the plain
   question (a fresh prompt: the same tokens the `sequential` system would produce), recorded as an
   event `sot_fallback` with the reason; the skeleton's passes stay in the trace.

The answer text is the points in order, `i. title` followed by the point's expansion. Output ids
are the skeleton's tokens (kind `plan`) then each point's tokens (`content`), or the skeleton's then
the fallback answer's.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from profiler.errors import UsageError, is_count
from runtime.engines.base import (
    Completion,
    Engine,
    GenerationConfig,
    Request,
    Step,
    TokenRecord,
    visibility_rows,
)
from runtime.sampling import Sampler

if TYPE_CHECKING:
    from runtime.hf_tokenizer import HFTokenizer

SKELETON_PROMPT = (
    "You're an organizer responsible for only giving the skeleton (not the full content) for answering the "
    "question. Provide the skeleton in a list of points (numbered 1., 2., 3., etc.) to answer the question. "
    "Instead of writing a full sentence, each skeleton point should be very brief with only 3~5 words. "
    "Generally, the skeleton should have 3~10 points.\n\nQuestion: {question}"
)
POINT_PROMPT = (
    "Continue and only continue the writing of point {index}. Write it very shortly in 1~2 "
    "sentences and do not continue with other points!"
)
_POINT = re.compile(r"(?:^|\s)(\d{1,2})[.)]\s+")


def parse_skeleton(text: str, complete: bool, max_points: int) -> list[tuple[int, str]]:
    """Numbered points `(index, title)` numbered 1, 2, 3... in order; `complete` False drops the last
    point (the skeleton was cut off). Titles lose markdown emphasis and trailing punctuation."""
    marks = list(_POINT.finditer(text))
    points: list[tuple[int, str]] = []
    for k, m in enumerate(marks):
        if int(m.group(1)) != len(points) + 1:
            if points:
                break
            continue
        end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
        title = re.sub(r"[*_#`]+", "", text[m.end() : end]).split("\n")[0].strip().rstrip(".:;,")
        if not title:
            break
        points.append((len(points) + 1, title))
    if points and not complete:
        points.pop()
    return points[:max_points]


@dataclass
class Row:
    """One query row of a pass: its token, position, the slots it sees besides its own."""

    token: int
    position: int
    sees: list[int]


@dataclass
class Stream:
    sid: int
    slots: list[int] = field(default_factory=list)  # the stream's own KV (fed tokens)
    outs: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    position: int = 0  # of the next token fed
    done: bool = False
    stop: str = ""


class SotEngine(Engine):
    tok: HFTokenizer  # type: ignore[assignment]  # a chat model's: __init__ refuses one without followup_text
    name = "sot"
    default_model = "smollm2-135m"
    default_task = "open_questions"

    def __init__(
        self,
        model,
        tokenizer,
        config: GenerationConfig | None = None,
        skeleton_max_tokens: int = 64,
        point_max_tokens: int = 48,
        max_points: int = 8,
    ) -> None:
        super().__init__(model, tokenizer, config or GenerationConfig())
        for name, v in (
            ("skeleton_max_tokens", skeleton_max_tokens),
            ("point_max_tokens", point_max_tokens),
            ("max_points", max_points),
        ):
            if not is_count(v):
                raise UsageError(f"{name} must be an integer >= 1, got {v!r}")
        if not hasattr(tokenizer, "followup_text"):
            raise UsageError(
                "sot prompts a chat model: it needs a real model with its own tokenizer "
                "(--model smollm2-135m or gguf:PATH), not the byte tokenizer of the tiny models"
            )
        self.skeleton_max_tokens, self.point_max_tokens, self.max_points = (
            skeleton_max_tokens,
            point_max_tokens,
            max_points,
        )
        self.newline_ids = (
            frozenset(i for i in range(tokenizer.vocab_size) if "\n" in tokenizer.token_text(i))
            if tokenizer.vocab_size <= 4096
            else None
        )  # large vocabularies: checked per token instead

    # ------------------------------------------------------------------ one forward pass
    def _pass(self, kv, rows: list[Row], owner) -> tuple:
        """Feed `rows` (each sees `sees` + itself); returns (logits, new slots)."""
        slots = kv.allocate(len(rows), owner=owner)
        vis = visibility_rows([r.sees + [s] for r, s in zip(rows, slots)], kv.num_slots, self.device)
        logits = self.model(
            self.tensor([r.token for r in rows]), self.tensor([r.position for r in rows]), self.tensor(slots), vis, kv
        )
        return logits, slots

    def _is_newline(self, tok: int) -> bool:
        return tok in self.newline_ids if self.newline_ids is not None else "\n" in self.tok.token_text(tok)

    # ------------------------------------------------------------------ run
    def run(self, request: Request) -> Generator[Step, None, Completion]:
        st = _State(request, self.new_store(), Sampler(self.config.sampling, request.request_id))
        user = SKELETON_PROMPT.format(question=request.prompt)
        skel = yield from self._decode_alone(st, self.tok.chat_ids(user), [], 0, self.skeleton_max_tokens, "plan")
        text = self.tok.decode(skel.outs, skip_control=True)
        complete = skel.stop == "stop_token"
        points = parse_skeleton(text, complete, self.max_points)
        reason = "" if len(points) >= 2 else f"skeleton has {len(points)} parsable point(s)"
        tails: list[list[int]] = []
        if not reason:
            try:
                tails = self._point_tails(user, text, points, skel)
            except ValueError as e:
                reason = str(e)
        if reason:
            st.events.append({"event": "sot_fallback", "reason": reason, "skeleton": text})
            st.kv.free(st.prompt_slots + skel.slots)
            ans = yield from self._decode_alone(st, self.prompt_ids(request), [], 1, self.config.max_tokens, "content")
            return st.completion(self, [skel, ans], None, ans.stop)
        st.events.append({"event": "sot_skeleton", "points": len(points)})
        streams = yield from self._expand(st, skel, tails)
        return st.completion(
            self,
            [skel, *streams],
            points,
            "stop_token" if all(s.stop == "stop_token" for s in streams) else "max_tokens",
        )

    def _point_tails(self, user: str, text: str, points, skel: Stream) -> list[list[int]]:
        """Token ids each point's turn adds after the skeleton (the skeleton's last sampled token
        first, when it is not end-of-turn: it was never fed)."""
        pending = [] if skel.stop == "stop_token" else skel.outs[-1:]
        out = []
        for i, title in points:
            follow = self.tok.followup_text(user, text, POINT_PROMPT.format(index=i))
            out.append(pending + self.tok.encode(follow + f"{i}. {title}"))
        return out

    def _decode_alone(
        self, st: _State, prompt: list[int], sees: list[int], sid: int, limit: int, kind: str
    ) -> Generator[Step, None, Stream]:
        """Prefill `prompt` (seeing `sees` too) and decode one stream greedily to a stop or `limit`."""
        s = Stream(sid, position=0)
        max_pos = self.model.cfg.max_positions
        if len(prompt) >= max_pos:
            raise ValueError(f"prompt of {len(prompt)} tokens exceeds the model's {max_pos} positions")
        logits, fed, kv_read = self._pass_causal(st.kv, prompt, sees, owner=sid)
        st.prompt_tokens += len(prompt)
        if sid == 0:
            st.prompt_slots = list(fed)
        query = len(prompt)
        phase = "prefill"
        while True:
            tok = int(st.sample(logits[-1:])[0])
            st.record(s, tok, len(prompt) + len(s.outs), kind, visible=(-1, 0) if sid == 0 else (-1, sid))
            yield st.step(phase, (sid,), query, kv_read, (tok,))
            if self.is_stop(tok):
                s.stop = "stop_token"
            elif len(s.outs) >= limit:
                s.stop = "max_tokens"
            elif len(prompt) + len(s.outs) >= max_pos:
                s.stop = "max_positions"
            if s.stop:
                return s
            phase = "plan" if kind == "plan" else "decode"
            rows = [Row(tok, len(prompt) + len(s.outs) - 1, sees + fed)]
            logits, new = self._pass(st.kv, rows, owner=sid)
            query, kv_read = 1, len(sees) + len(fed) + 1
            fed += new
            s.slots.extend(new)
            st.slot_of_last(s, new[0])

    def _pass_causal(self, kv, prompt: list[int], sees: list[int], owner):
        """A prefill of `prompt` at positions 0..: row j sees `sees` and rows 0..j. Returns (logits,
        slots, KV slots read)."""
        slots = kv.allocate(len(prompt), owner=owner)
        rows = [sees + slots[: j + 1] for j in range(len(prompt))]
        vis = visibility_rows(rows, kv.num_slots, self.device)
        logits = self.model(self.tensor(prompt), self.tensor(list(range(len(prompt)))), self.tensor(slots), vis, kv)
        return logits, slots, sum(map(len, rows))

    def _expand(self, st: _State, skel: Stream, tails: list[list[int]]) -> Generator[Step, None, list[Stream]]:
        """All points: one prefill pass (shared part once, every tail), then one batched pass per step."""
        base = st.prompt_slots + skel.slots  # the skeleton prompt and the fed skeleton tokens
        pos0 = len(st.prompt_slots) + len(skel.slots)
        n_common = _common_prefix(tails)
        common_rows = [Row(t, pos0 + j, list(base)) for j, t in enumerate(tails[0][:n_common])]
        streams = [Stream(i + 1) for i in range(len(tails))]
        rows: list[Row] = []
        spans = []
        for _s, tail in zip(streams, tails):
            own = tail[n_common:]
            spans.append((len(common_rows) + len(rows), len(own)))
            rows += [Row(t, pos0 + n_common + j, []) for j, t in enumerate(own)]
        all_rows = common_rows + rows
        slots = st.kv.allocate(len(all_rows), owner="points")
        shared = base + slots[:n_common]
        vis_rows = [base + slots[: j + 1] for j in range(n_common)]
        for (start, n), s in zip(spans, streams):
            own = slots[start : start + n]
            s.slots = list(own)
            s.position = pos0 + n_common + n
            vis_rows += [shared + own[: j + 1] for j in range(n)]
        vis = visibility_rows(vis_rows, st.kv.num_slots, self.device)
        logits = self.model(
            self.tensor([r.token for r in all_rows]),
            self.tensor([r.position for r in all_rows]),
            self.tensor(slots),
            vis,
            st.kv,
        )
        last = [start + n - 1 for start, n in spans]
        kv_read = sum(len(v) for v in vis_rows)
        yield from self._expand_loop(st, streams, shared, logits[last], len(all_rows), kv_read)
        return streams

    def _expand_loop(
        self, st: _State, streams: list[Stream], shared: list[int], logits, query_rows: int, kv_read: int
    ) -> Generator[Step, None, None]:
        phase, budget = "prefill", self.config.max_tokens
        live = list(streams)
        while True:
            toks = [int(t) for t in st.sample(logits)]
            for s, tok in zip(live, toks):
                st.record(s, tok, s.position, "content", visible=(-1, 0, s.sid))
                if self.is_stop(tok):
                    s.stop = "stop_token"
                elif self._is_newline(tok):
                    s.stop = "stop_token"  # the point is written; a newline would start another
                elif len(s.outs) >= self.point_max_tokens:
                    s.stop = "max_tokens"
                elif s.position + 1 >= self.model.cfg.max_positions:
                    s.stop = "max_positions"
            yield st.step(phase, tuple(s.sid for s in live), query_rows, kv_read, tuple(toks))
            if sum(len(s.outs) for s in streams) >= budget:
                for s in live:
                    s.stop = s.stop or "max_tokens"
            live = [s for s in live if not s.stop]
            if not live:
                return
            phase = "decode"
            rows = [Row(s.outs[-1], s.position, shared + s.slots) for s in live]
            logits, new = self._pass(st.kv, rows, owner="points")
            for s, slot in zip(live, new):
                s.slots.append(slot)
                s.position += 1
                st.slot_of_last(s, slot)
            query_rows, kv_read = len(rows), sum(len(r.sees) + 1 for r in rows)


def _common_prefix(seqs: list[list[int]]) -> int:
    n = min(len(s) for s in seqs) - 1  # every tail keeps at least one token of its own
    for j in range(max(0, n)):
        if any(s[j] != seqs[0][j] for s in seqs):
            return j
    return max(0, n)


class _State:
    """A request's KV, sampler, step counter and token records."""

    def __init__(self, request: Request, kv, sample: Sampler) -> None:
        self.request, self.kv, self.sample = request, kv, sample
        self.step_index = 0
        self.prompt_slots: list[int] = []
        self.records: dict[int, list[TokenRecord]] = {}
        self.events: list[dict] = []
        self.peak_tokens = self.peak_bytes = 0
        self.prompt_tokens = 0

    def record(self, s: Stream, tok: int, position: int, kind: str, visible: tuple[int, ...]) -> None:
        s.outs.append(tok)
        s.steps.append(self.step_index)
        self.records.setdefault(s.sid, []).append(
            TokenRecord(tok, s.sid, self.step_index, position, kind, visible_streams=visible)
        )

    def slot_of_last(self, s: Stream, slot: int) -> None:
        """The token sampled before this pass was fed into `slot`."""
        self.records[s.sid][-1].kv_slot = slot

    def step(self, phase: str, streams: tuple[int, ...], query: int, kv_read: int, emitted: tuple[int, ...]) -> Step:
        live, held = self.kv.live_tokens, self.kv.bytes_allocated
        self.peak_tokens, self.peak_bytes = max(self.peak_tokens, live), max(self.peak_bytes, held)
        out = Step(
            self.request.request_id, self.step_index, phase, streams, query, kv_read, live, held, emitted=emitted
        )
        self.step_index += 1
        return out

    def completion(self, eng: SotEngine, streams: list[Stream], points, stop_reason: str) -> Completion:
        tokens = [r for s in streams for r in self.records.get(s.sid, [])]
        if points is None:  # fallback: the sequential answer is the text
            text = eng.tok.decode(streams[1].outs, skip_control=True)
        else:
            text = "\n".join(
                f"{i}. {title}" + eng.tok.decode(s.outs, skip_control=True).rstrip()
                for (i, title), s in zip(points, streams[1:])
            )
        graph = _graph(len(self.prompt_slots), streams, points is not None)
        graph["graph"] = {"critical_path_tokens": self.step_index, "events": len(self.events)}
        return Completion(
            request_id=self.request.request_id,
            prompt_tokens=self.prompt_tokens,
            output_ids=[t.token_id for t in tokens],
            text=text,
            tokens=tokens,
            graph=graph,
            critical_path_tokens=self.step_index,
            steps=self.step_index,
            peak_live_kv_tokens=self.peak_tokens,
            peak_kv_bytes=self.peak_bytes,
            status="ok" if stop_reason == "stop_token" else "truncated",
            stop_reason=stop_reason,
            events=list(self.events),
        )


def _graph(prompt_tokens: int, streams: list[Stream], parallel: bool) -> dict:
    """prompt -> skeleton -> every point (parallel), or prompt -> skeleton -> fallback answer."""
    skel, rest = streams[0], streams[1:]
    nodes = [
        {"id": "prompt", "kind": "prompt", "stream": -1, "tokens": prompt_tokens},
        {"id": "main:0", "kind": "main", "stream": 0, "tokens": len(skel.outs)},
    ]
    links = [{"source": "prompt", "target": "main:0"}]
    for s in rest:
        nid = f"thread:{s.sid}" if parallel else "main:1"
        nodes.append({"id": nid, "kind": "async" if parallel else "main", "stream": s.sid, "tokens": len(s.outs)})
        links.append({"source": "main:0", "target": nid})
    return {"directed": True, "multigraph": False, "graph": {}, "nodes": nodes, "links": links}
