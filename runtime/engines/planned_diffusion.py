"""`planned_diffusion`: plan autoregressively, then denoise the planned spans in parallel
(arXiv 2510.18087; official code planned-diffusion/planned-diffusion, dream/generation_utils_cached_pd.py).

Per round: decode plan tokens one pass each with the KV cache (phase `plan`; the first pass is the
prompt's `prefill`) and parse them incrementally (`runtime.lang.planned_diffusion.PlanParser`);
when the model writes the round's end token (`<sync/>` or `<eos>`), lay out one span per entry
(`<async>` + length x [MASK] + `</async>`, length = N x length_scale) and denoise all spans of the
round together, one forward pass per step over every active span (phase `denoise`). The prefix
(prompt, plan, earlier rounds) stays cached; a finished span leaves the passes, after one last
pass that rewrites its K/V with its final tokens (folded into the next pass). Under PD-SA this
caching is exact; under the dense mask a finished span's K/V would change with its active
siblings and are kept anyway, as in the official code. After `<sync/>` the
end token is fed (phase `sync`), seeing every span, and the next round is planned; `<eos>` ends.
Visibility is `hybrid_mask`, the function training uses. Text outside plan entries is ordinary
AR content (the closing line after `<sync/>`; a whole answer when the model does not plan).

Knobs (`solm capture --knob k=v`): steps_ratio (steps = ratio x longest span of the round), order
(entropy, max_prob, margin), confidence_threshold (null = off), length_scale (tokens per plan
unit), block_sparse (siblings blind, PD-SA; false = dense, PD), cache_committed (approximate:
keep a committed span token's K/V once recomputed, Fast-dLLM style), guards max_plan_tokens,
max_rounds, max_spans, max_span_tokens, and for tests recompute_all (no cache: every pass
recomputes the whole sequence) and forced_plan (text fed instead of sampled plan tokens).

Trace: each span token's stream is its span (AR tokens: stream 0) and its step is the denoising
pass that unmasked it; each denoise step's `note` is JSON with the round, the step within it, the
masks left and unmasked per span; `Completion.events` holds a `round` record per round (span
lengths, topics, steps, the step each span finished at) and a `pd` summary (AR and denoise
passes; the time split is the steps table's durations by phase).
"""

from __future__ import annotations

import json

import torch

from runtime.engines.base import (
    Completion,
    Engine,
    GenerationConfig,
    PassInputs,
    Request,
    Step,
    TokenRecord,
)
from runtime.engines.diffusion_common import Denoiser, LaidOutState, Layout, SpanState, check_knobs, scaffold, steps_for
from runtime.engines.operating_points import operating_knobs
from runtime.kv import RequestKV
from runtime.lang.planned_diffusion import ASYNC, ASYNC_END, MASK, PAD, SYNC, UNIT, PlanParser
from runtime.model import TinyLM
from runtime.sampling import Sampler
from runtime.tokenizer import Tokenizer

# The shipped defaults: the operating point bench/planned_diffusion.py chose on the dev split
# (runtime/engines/operating_points.json); the literals are the paper's plain settings, used
# only when that file records none.
_OP = operating_knobs("planned_diffusion")


class PlannedDiffusionEngine(Engine):
    name = "planned_diffusion"
    default_model = "pd-tiny"
    default_task = "word_facts"

    def __init__(
        self,
        model: TinyLM,
        tokenizer: Tokenizer,
        config: GenerationConfig = GenerationConfig(),
        *,
        steps_ratio: float = _OP.get("steps_ratio", 1.0),
        order: str = "entropy",
        confidence_threshold: float | None = _OP.get("confidence_threshold"),
        length_scale: float = _OP.get("length_scale", UNIT),
        block_sparse: bool = _OP.get("block_sparse", True),
        max_plan_tokens: int = 96,
        max_rounds: int = 8,
        max_spans: int = 8,
        max_span_tokens: int = 64,
        cache_committed: bool = _OP.get("cache_committed", False),
        recompute_all: bool = False,
        forced_plan: str = "",
    ) -> None:
        super().__init__(model, tokenizer, config)
        check_knobs(steps_ratio, order, confidence_threshold, length_scale)
        for name, v in (
            ("max_plan_tokens", max_plan_tokens),
            ("max_rounds", max_rounds),
            ("max_spans", max_spans),
            ("max_span_tokens", max_span_tokens),
        ):
            if int(v) < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        self.steps_ratio, self.order, self.threshold = float(steps_ratio), order, confidence_threshold or None
        self.length_scale, self.block_sparse = float(length_scale), bool(block_sparse)
        self.max_plan_tokens, self.max_rounds = int(max_plan_tokens), int(max_rounds)
        self.max_spans, self.max_span_tokens = int(max_spans), int(max_span_tokens)
        self.recompute_all, self.forced_plan, self.cache_committed = (
            bool(recompute_all),
            forced_plan,
            bool(cache_committed),
        )
        t = tokenizer.token_id
        self.tags = (t(ASYNC), t(ASYNC_END))
        self.mask_id, self.pad_id_span, self.sync_id = t(MASK), t(PAD), t(SYNC)

    def start(self, request: Request, kv: RequestKV) -> PlannedDiffusionState:
        return PlannedDiffusionState(self, request, kv)

    def _complete(
        self,
        request: Request,
        n: int,
        lay: Layout,
        recs: dict[int, TokenRecord],
        tail: list[TokenRecord],
        spans: list[SpanState],
        span_round: dict[int, int],
        events: list[dict],
        steps: int,
        peak: list[int],
        stop_reason: str,
        ar_passes: int,
        dn_passes: int,
    ) -> Completion:
        for i, rec in recs.items():  # a token never fed (the run stopped first) has no slot
            rec.kv_slot = lay.slots[i] if i < len(lay.slots) else -1
        tokens = [recs[i] for i in sorted(recs)] + tail
        out = [t.token_id for t in tokens]
        text = self.tok.decode([t.token_id for t in tokens if t.kind == "content"], skip_control=True)
        ar_tokens = sum(1 for t in tokens if t.stream == 0)
        per_round: dict[int, int] = {}
        for s in spans:
            per_round[span_round[s.sid]] = max(per_round.get(span_round[s.sid], 0), s.length)
        at_length = all(s.finished_at == s.length for s in spans) if spans else None
        events.append(
            {
                "event": "pd",
                "rounds": len(per_round),
                "spans": len(spans),
                "ar_passes": ar_passes,
                "denoise_passes": dn_passes,
                "spans_finish_at_length": at_length,
            }
        )
        return Completion(
            request_id=request.request_id,
            prompt_tokens=n,
            output_ids=out,
            text=text,
            tokens=tokens,
            graph=self._graph(n, tokens, spans, span_round),
            critical_path_tokens=ar_tokens + sum(per_round.values()),
            steps=steps,
            peak_live_kv_tokens=peak[0],
            peak_kv_bytes=peak[1],
            status="ok" if stop_reason == "stop_token" else "truncated",
            stop_reason=stop_reason,
            events=events,
        )

    @staticmethod
    def _graph(n: int, tokens: list[TokenRecord], spans: list[SpanState], span_round: dict[int, int]) -> dict:
        """Chunk DAG: prompt -> plan:0 -> spans of round 0 -> plan:1 (after <sync/>) -> ...
        AR tokens belong to the plan chunk of the rounds whose spans precede them."""
        ends: dict[int, int] = {}
        for s in spans:
            ends[span_round[s.sid]] = max(ends.get(span_round[s.sid], -1), s.rows[-1])
        ar_count: dict[int, int] = {}
        for t in tokens:
            if t.stream == 0:
                k = sum(t.position_id > e for e in ends.values())
                ar_count[k] = ar_count.get(k, 0) + 1
        n_plan = max([0, *ar_count, *(r + 1 for r in ends if r + 1 in ar_count)]) + 1
        nodes = [{"id": "prompt", "kind": "prompt", "stream": -1, "tokens": n}]
        nodes += [{"id": f"plan:{i}", "kind": "plan", "stream": 0, "tokens": ar_count.get(i, 0)} for i in range(n_plan)]
        links = [{"source": "prompt", "target": "plan:0"}]
        links += [{"source": f"plan:{i}", "target": f"plan:{i + 1}"} for i in range(n_plan - 1)]
        for s in spans:
            rr = span_round[s.sid]
            nodes.append(
                {
                    "id": f"span:{s.sid}",
                    "kind": "span",
                    "stream": s.sid,
                    "tokens": len(s.rows),
                    "round": rr,
                    "length": s.length,
                    "finished_at_step": s.finished_at,
                }
            )
            links.append({"source": f"plan:{rr}", "target": f"span:{s.sid}"})
            if rr + 1 < n_plan:
                links.append({"source": f"span:{s.sid}", "target": f"plan:{rr + 1}"})
        return {"directed": True, "multigraph": False, "graph": {}, "nodes": nodes, "links": links}


class PlannedDiffusionState(LaidOutState):
    """One request: autoregressive plan passes (`mode` "ar"), then the round's denoising passes
    (`mode` "denoise"), round after round. `after` decides what the next pass is."""

    eng: PlannedDiffusionEngine

    def __init__(self, eng: PlannedDiffusionEngine, request: Request, kv: RequestKV) -> None:
        self.eng, self.req, self.kv = eng, request, kv
        self.sample = Sampler(eng.config.sampling, request.request_id)
        self.lay = Layout(eng.model.cfg.max_positions, kv, eng.block_sparse)
        prompt = eng.prompt_ids(request)
        self.n = len(prompt)
        self.lay.append("ar", prompt)
        self.parser = PlanParser(eng.tok, eng.length_scale, eng.max_plan_tokens, eng.max_spans, eng.max_span_tokens)
        self.forced = eng.tok.encode(eng.forced_plan) if eng.forced_plan else []
        self.recs: dict[int, TokenRecord] = {}  # layout index -> record
        self.spans: list[SpanState] = []
        self.span_round: dict[int, int] = {}
        self.revealed: list[int] = []  # span ids the AR stream sees (after <sync/>)
        self.events: list[dict] = []
        self.tail: list[TokenRecord] = []  # the end token a stop kept from being fed (<eos>, <sync/>)
        self.step = self.rnd = self.ar_passes = self.dn_passes = self.ar_generated = 0
        self.refresh: list[int] = []
        self.peak = [kv.live_tokens, kv.bytes_allocated]
        self.mode, self.phase, self.stop_reason = "ar", "prefill", "stop_token"
        self.ar_rows = list(range(self.n))  # the next AR pass's own rows
        self.den: Denoiser | None = None
        self.round_end: tuple = ()  # (parsed end, its token, its step) of the round being denoised

    @property
    def _den(self) -> Denoiser:
        """The round being denoised (mode "denoise")."""
        assert self.den is not None, "no round is being denoised"
        return self.den

    # ------------------------------------------------------------------ the next pass
    def pass_rows(self) -> list[int]:
        if self.mode == "denoise":
            return self._den.rows()
        if self.eng.recompute_all:
            return list(range(len(self.lay)))
        return sorted({*self.ar_rows, *self.refresh})

    def max_kv_tokens(self) -> int:
        eng = self.eng
        return self.n + eng.config.max_tokens + eng.max_rounds * (1 + eng.max_spans * (eng.max_span_tokens + 2))

    def prompt_left(self) -> int:
        return len(self.ar_rows) if self.phase == "prefill" else 0

    def prompt_chunk(self, k: int) -> PassInputs:
        rows, self.ar_rows = self.ar_rows[:k], self.ar_rows[k:]
        return self.lay.inputs(rows, "prefill", upto=rows[-1] + 1)

    def restart_prefill(self) -> None:
        self.lay.slots, self.ar_rows = [], list(range(self.n))

    def next_inputs(self) -> PassInputs:
        self.rows = self.pass_rows()
        self.inp = self.lay.inputs(self.rows, self.phase if self.mode == "ar" else "denoise")
        return self.inp

    def after(self, logits: torch.Tensor, attention: torch.Tensor | None) -> Step:
        logits = logits[self.inp.skip :]
        self.peak = [max(self.peak[0], self.kv.live_tokens), max(self.peak[1], self.kv.bytes_allocated)]
        if self.mode == "denoise":
            return self._after_denoise(logits)
        return self._after_ar(logits[-1:])

    def _after_ar(self, last: torch.Tensor) -> Step:
        eng = self.eng
        self.refresh, self.ar_passes = [], self.ar_passes + 1
        tid = self.forced.pop(0) if self.forced else int(self.sample(last)[0])
        parsed = self.parser.feed(tid)
        self.events += [{"event": "plan", "round": self.rnd, "what": e} for e in parsed.events]
        step = Step(
            self.req.request_id,
            self.step,
            self.phase,
            (0,),
            len(self.rows),
            self.inp.kv_read,
            self.kv.live_tokens,
            self.kv.bytes_allocated,
            emitted=(tid,),
            note=json.dumps({"round": self.rnd}),
        )
        pos_step, self.step, self.ar_generated = self.step, self.step + 1, self.ar_generated + 1
        if parsed.end is None:
            (i,) = self.lay.append("ar", [tid])
            self.recs[i] = TokenRecord(tid, 0, pos_step, i, parsed.kind, -1, (-1, 0, *self.revealed))
            if self.ar_generated >= eng.config.max_tokens:
                self._stop("max_tokens")
            elif i + 1 >= eng.model.cfg.max_positions:  # the next token would have no position (was: UsageError)
                self._stop("max_positions")
            else:
                self.phase, self.ar_rows = "plan", [i]
            return step
        entries = self.parser.pop_round()
        if entries and len(self.lay) + sum(e.length + 2 for e in entries) + 1 >= eng.model.cfg.max_positions:
            self._stop_at_end(tid, pos_step, "max_positions")
            return step
        self.round_end = (parsed.end, tid, pos_step)
        if entries:  # lay out the round's spans and denoise them together
            self._start_round(entries)
        else:
            self._end_round()
        return step

    def _start_round(self, entries) -> None:
        eng = self.eng
        self.first = len(self.spans)
        for e in entries:
            s = scaffold(self.lay, len(self.spans) + 1, e.length, eng.tags, eng.mask_id)
            self.spans.append(s)
            self.span_round[s.sid] = self.rnd
        group = self.spans[self.first :]
        self.scheduled_steps = steps_for(max(s.length for s in group), eng.steps_ratio)
        self.step0, self.entries = self.step, entries
        self.den = Denoiser(
            self.lay,
            group,
            self.scheduled_steps,
            self.sample,
            eng.order,
            eng.threshold,
            self.refresh,
            eng.recompute_all,
            eng.cache_committed,
        )
        self.mode = "denoise"

    def _after_denoise(self, logits: torch.Tensor) -> Step:
        d = self._den.after(logits, self.inp.kv_read)
        self.dn_passes += 1
        note = {"round": self.rnd, "step": d["i"] + 1, "masks_left": d["masks_left"], "unmasked": d["unmasked"]}
        step = Step(
            self.req.request_id,
            self.step,
            "denoise",
            d["streams"],
            d["rows"],
            d["kv_read"],
            self.kv.live_tokens,
            self.kv.bytes_allocated,
            emitted=d["emitted"],
            note=json.dumps(note),
        )
        self.step += 1
        if self._den.finished:
            self.refresh, self.mode = self._den.refresh, "ar"
            self._record_round()
            self._end_round()
        return step

    def _record_round(self) -> None:
        eng, group = self.eng, self._den.spans
        older = [s.sid for s in self.spans[: self.first]]
        for s in group:
            sibs = tuple(x.sid for x in group) if not eng.block_sparse else (s.sid,)
            vis = (-1, 0, *older, *sibs)
            for r in s.rows:
                t = self.lay.ids[r]
                kind = (
                    "tag"
                    if t in eng.tags
                    else "pad"
                    if t == eng.pad_id_span
                    else "mask"
                    if t == eng.mask_id
                    else "content"
                )
                self.recs[r] = TokenRecord(t, s.sid, self.step0 + s.unmasked_at.get(r, 0), r, kind, -1, vis)
        self.events.append(
            {
                "event": "round",
                "round": self.rnd,
                "end": self.round_end[0].kind,
                "topics": [e.topic for e in self.entries],
                "span_lengths": [s.length for s in group],
                "denoise_steps": self.step - self.step0,
                "scheduled_steps": self.scheduled_steps,
                "finished_at": [s.finished_at for s in group],
            }
        )
        self.rnd += 1

    def _end_round(self) -> None:
        """After a round's end token (and its spans, if any): stop, or feed `<sync/>` and plan on."""
        end, tid, pos_step = self.round_end
        if end.kind != "sync":
            self._stop_at_end(tid, pos_step, "stop_token" if end.kind == "eos" else "max_plan_tokens")
            return
        if self.rnd >= self.eng.max_rounds:
            self._stop_at_end(tid, pos_step, "max_rounds")
            return
        if len(self.lay) + 1 >= self.eng.model.cfg.max_positions:  # no position after `<sync/>`
            self._stop_at_end(tid, pos_step, "max_positions")
            return
        self.revealed = [s.sid for s in self.spans]
        (i,) = self.lay.append("sync", [tid])
        self.recs[i] = TokenRecord(tid, 0, pos_step, i, "tag", -1, (-1, 0, *self.revealed))
        self.phase, self.ar_rows = "sync", [i]

    def _stop(self, reason: str) -> None:
        self.done, self.stop_reason = True, reason

    def _stop_at_end(self, tid: int, pos_step: int, reason: str) -> None:
        """Stop on a round's end token, which is never fed: it closes the output (the tail) at the
        position after the layout, stamped with the pass that sampled it."""
        self.tail.append(TokenRecord(tid, 0, pos_step, len(self.lay), "tag", -1, (-1, 0, *self.revealed)))
        self._stop(reason)

    # ------------------------------------------------------------------ preemption
    def completion(self) -> Completion:
        return self.eng._complete(
            self.req,
            self.n,
            self.lay,
            self.recs,
            self.tail,
            self.spans,
            self.span_round,
            self.events,
            self.step,
            self.peak,
            self.stop_reason,
            self.ar_passes,
            self.dn_passes,
        )
