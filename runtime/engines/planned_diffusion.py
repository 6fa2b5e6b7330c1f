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
from collections.abc import Generator

from runtime.engines.base import Completion, Engine, GenerationConfig, Request, Step, TokenRecord
from runtime.engines.diffusion_common import Layout, SpanState, check_knobs, denoise, scaffold, steps_for
from runtime.lang.planned_diffusion import ASYNC, ASYNC_END, MASK, PAD, SYNC, UNIT, PlanParser
from runtime.engines.operating_points import operating_knobs
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

    def __init__(self, model: TinyLM, tokenizer: Tokenizer, config: GenerationConfig = GenerationConfig(), *,
                 steps_ratio: float = _OP.get("steps_ratio", 1.0), order: str = "entropy",
                 confidence_threshold: float | None = _OP.get("confidence_threshold"),
                 length_scale: float = _OP.get("length_scale", UNIT), block_sparse: bool = _OP.get("block_sparse", True),
                 max_plan_tokens: int = 96, max_rounds: int = 8, max_spans: int = 8, max_span_tokens: int = 64,
                 cache_committed: bool = _OP.get("cache_committed", False), recompute_all: bool = False,
                 forced_plan: str = "") -> None:
        super().__init__(model, tokenizer, config)
        check_knobs(steps_ratio, order, confidence_threshold, length_scale)
        for name, v in (("max_plan_tokens", max_plan_tokens), ("max_rounds", max_rounds), ("max_spans", max_spans),
                        ("max_span_tokens", max_span_tokens)):
            if int(v) < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        self.steps_ratio, self.order, self.threshold = float(steps_ratio), order, confidence_threshold or None
        self.length_scale, self.block_sparse = float(length_scale), bool(block_sparse)
        self.max_plan_tokens, self.max_rounds = int(max_plan_tokens), int(max_rounds)
        self.max_spans, self.max_span_tokens = int(max_spans), int(max_span_tokens)
        self.recompute_all, self.forced_plan, self.cache_committed = bool(recompute_all), forced_plan, bool(cache_committed)
        t = tokenizer.token_id
        self.tags = (t(ASYNC), t(ASYNC_END))
        self.mask_id, self.pad_id_span, self.sync_id = t(MASK), t(PAD), t(SYNC)

    def run(self, request: Request) -> Generator[Step, None, Completion]:
        kv = self.new_store()
        sample = Sampler(self.config.sampling, request.request_id)
        lay = Layout(self.model, kv, self.block_sparse)
        prompt = self.prompt_ids(request)
        n = len(prompt)
        lay.append("ar", prompt)
        parser = PlanParser(self.tok, self.length_scale, self.max_plan_tokens, self.max_spans, self.max_span_tokens)
        forced = self.tok.encode(self.forced_plan) if self.forced_plan else []
        recs: dict[int, TokenRecord] = {}  # layout index -> record
        spans: list[SpanState] = []
        span_round: dict[int, int] = {}
        revealed: list[int] = []  # span ids the AR stream sees (after <sync/>)
        events: list[dict] = []
        tail: list[TokenRecord] = []  # the final <eos>, never fed
        step, rnd, ar_passes, dn_passes, refresh = 0, 0, 0, 0, []
        peak = [kv.live_tokens, kv.bytes_allocated]

        def ar_pass(rows: list[int], phase: str):
            nonlocal refresh, ar_passes
            rows = list(range(len(lay))) if self.recompute_all else sorted({*rows, *refresh})
            logits, read = lay.forward(rows)
            refresh, ar_passes = [], ar_passes + 1
            peak[0], peak[1] = max(peak[0], kv.live_tokens), max(peak[1], kv.bytes_allocated)
            return logits[-1:], rows, read

        last, rows, read = ar_pass(list(range(n)), "prefill")
        phase, stop_reason, ar_generated = "prefill", "stop_token", 0
        while True:
            tid = forced.pop(0) if forced else int(sample(last)[0])
            parsed = parser.feed(tid)
            events += [{"event": "plan", "round": rnd, "what": e} for e in parsed.events]
            yield Step(request.request_id, step, phase, (0,), len(rows), read, kv.live_tokens, kv.bytes_allocated,
                       emitted=(tid,), note=json.dumps({"round": rnd}))
            pos_step, step, ar_generated = step, step + 1, ar_generated + 1
            if parsed.end is None:
                (i,) = lay.append("ar", [tid])
                recs[i] = TokenRecord(tid, 0, pos_step, i, parsed.kind, lay.slots[i], (-1, 0, *revealed))
                if ar_generated >= self.config.max_tokens:
                    stop_reason = "max_tokens"
                    break
                phase = "plan"
                last, rows, read = ar_pass([i], phase)
                continue
            entries = parser.pop_round()
            if entries and len(lay) + sum(e.length + 2 for e in entries) + 1 >= self.model.cfg.max_positions:
                stop_reason = "max_positions"
                break
            if entries:  # lay out the round's spans and denoise them together
                first = len(spans)
                for e in entries:
                    s = scaffold(lay, len(spans) + 1, e.length, self.tags, self.mask_id)
                    spans.append(s)
                    span_round[s.sid] = rnd
                group = spans[first:]
                steps = steps_for(max(s.length for s in group), self.steps_ratio)
                step0 = step
                gen = denoise(lay, group, steps, sample, self.order, self.threshold, refresh, self.recompute_all,
                              self.cache_committed)
                while True:
                    try:
                        d = next(gen)
                    except StopIteration as fin:
                        refresh = fin.value
                        break
                    dn_passes += 1
                    peak[0], peak[1] = max(peak[0], kv.live_tokens), max(peak[1], kv.bytes_allocated)
                    note = {"round": rnd, "step": d["i"] + 1, "masks_left": d["masks_left"], "unmasked": d["unmasked"]}
                    yield Step(request.request_id, step, "denoise", d["streams"], d["rows"], d["kv_read"], kv.live_tokens,
                               kv.bytes_allocated, emitted=d["emitted"], note=json.dumps(note))
                    step += 1
                older = [s.sid for s in spans[:first]]
                for s in group:
                    sibs = tuple(x.sid for x in group) if not self.block_sparse else (s.sid,)
                    vis = (-1, 0, *older, *sibs)
                    for r in s.rows:
                        t = lay.ids[r]
                        kind = "tag" if t in self.tags else "pad" if t == self.pad_id_span else "mask" if t == self.mask_id else "content"
                        recs[r] = TokenRecord(t, s.sid, step0 + s.unmasked_at.get(r, 0), r, kind, lay.slots[r], vis)
                events.append({"event": "round", "round": rnd, "end": parsed.end.kind, "topics": [e.topic for e in entries],
                               "span_lengths": [s.length for s in group], "denoise_steps": step - step0, "scheduled_steps": steps,
                               "finished_at": [s.finished_at for s in group]})
                rnd += 1
            if parsed.end.kind != "sync":
                tail.append(TokenRecord(tid, 0, pos_step, len(lay), "tag", -1, (-1, 0, *revealed)))
                stop_reason = "stop_token" if parsed.end.kind == "eos" else "max_plan_tokens"
                break
            if rnd >= self.max_rounds:
                stop_reason = "max_rounds"
                break
            revealed = [s.sid for s in spans]
            (i,) = lay.append("sync", [tid])
            recs[i] = TokenRecord(tid, 0, pos_step, i, "tag", lay.slots[i], (-1, 0, *revealed))
            phase = "sync"
            last, rows, read = ar_pass([i], phase)
        return self._complete(request, n, lay, recs, tail, spans, span_round, events, step, peak, stop_reason,
                              ar_passes, dn_passes)

    def _complete(self, request: Request, n: int, lay: Layout, recs: dict[int, TokenRecord], tail: list[TokenRecord],
                  spans: list[SpanState], span_round: dict[int, int], events: list[dict], steps: int, peak: list[int],
                  stop_reason: str, ar_passes: int, dn_passes: int) -> Completion:
        tokens = [recs[i] for i in sorted(recs)] + tail
        out = [t.token_id for t in tokens]
        text = self.tok.decode([t.token_id for t in tokens if t.kind == "content"], skip_control=True)
        ar_tokens = sum(1 for t in tokens if t.stream == 0)
        per_round: dict[int, int] = {}
        for s in spans:
            per_round[span_round[s.sid]] = max(per_round.get(span_round[s.sid], 0), s.length)
        at_length = all(s.finished_at == s.length for s in spans) if spans else None
        events.append({"event": "pd", "rounds": len(per_round), "spans": len(spans), "ar_passes": ar_passes,
                       "denoise_passes": dn_passes, "spans_finish_at_length": at_length})
        return Completion(
            request_id=request.request_id, prompt_tokens=n, output_ids=out, text=text, tokens=tokens,
            graph=self._graph(n, tokens, spans, span_round), critical_path_tokens=ar_tokens + sum(per_round.values()),
            steps=steps, peak_live_kv_tokens=peak[0], peak_kv_bytes=peak[1],
            status="ok" if stop_reason == "stop_token" else "truncated", stop_reason=stop_reason, events=events)

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
            nodes.append({"id": f"span:{s.sid}", "kind": "span", "stream": s.sid, "tokens": len(s.rows), "round": rr,
                          "length": s.length, "finished_at_step": s.finished_at})
            links.append({"source": f"plan:{rr}", "target": f"span:{s.sid}"})
            if rr + 1 < n_plan:
                links.append({"source": f"span:{s.sid}", "target": f"plan:{rr + 1}"})
        return {"directed": True, "multigraph": False, "graph": {}, "nodes": nodes, "links": links}
