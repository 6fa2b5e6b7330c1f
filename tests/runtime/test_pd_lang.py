"""Plan language: annotation from dependence structure, and a parser that survives anything."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.lang.planned_diffusion import PlanParser, annotate, answer_of, entry_text, units_for
from runtime.tokenizer import Tokenizer

TOK = Tokenizer()
META = {"parts": ["cat up CAT rev tac len 3\n", "do up DO rev od len 2\n"], "topics": ["c", "d"], "closing": "ini CD"}


def feed_all(parser: PlanParser, ids: list[int]):
    return [parser.feed(i) for i in ids]


def test_annotate_rounds_and_answer():
    rounds = annotate(META, TOK)
    assert [r.end for r in rounds] == ["sync", "eos"]
    assert [(s.topic, s.units) for s in rounds[0].spans] == [("c", 3), ("d", 3)]
    assert answer_of(rounds, TOK) == "".join(META["parts"]) + META["closing"]
    assert annotate({"parts": [], "topics": [], "closing": "ab c"}, TOK)[0].spans == ()  # no structure: no plan
    assert units_for(30) == 3 and units_for(31) == 4 and units_for(0) == 1


def test_parse_well_formed_round():
    p = PlanParser(TOK, length_scale=10)
    out = feed_all(p, TOK.encode(entry_text("c", 3) + entry_text("7", 2) + "<sync/>"))
    assert [o.entry for o in out if o.entry] and out[-1].end.kind == "sync"
    assert [(e.topic, e.units, e.length) for e in p.pop_round()] == [("c", 3, 30), ("7", 2, 20)]
    assert all(o.kind == "plan" for o in out[:-1]) and out[-1].kind == "tag"
    assert not any(o.events for o in out)


def test_parse_malformed_cases():
    p = PlanParser(TOK, length_scale=10, max_span_tokens=64)
    out = feed_all(p, TOK.encode("<promise>-<topic>x</topic><promise>-<topic>y 99999999</topic></topic><eos>"))
    entries = p.pop_round()
    assert [e.length for e in entries] == [10, 64]  # no number: one unit; huge: clamped
    events = [e for o in out for e in o.events]
    assert "no number" in events and any("clamped" in e for e in events) and "stray </topic>" in events
    assert out[-1].end.kind == "eos"
    # an entry that never closes, then a plan that never ends
    p = PlanParser(TOK, max_plan_tokens=40, max_entry_tokens=8)
    out = feed_all(p, TOK.encode("<promise>-<topic>aaaaaaaaaaaaaaaa" + "z" * 60))
    ends = [o.end for o in out if o.end]
    assert ends and ends[0].kind == "guard" and len(p.pop_round()) == 1


token_ids = st.integers(min_value=0, max_value=TOK.vocab_size - 1)
plan_tags = st.sampled_from(TOK.encode("<promise>-<topic></topic><sync/><async></async>[MASK][PAD]") + [TOK.eos_id])
digits = st.sampled_from(TOK.encode("0123456789 "))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(token_ids, plan_tags, digits, digits), max_size=300),
    st.floats(min_value=0.1, max_value=1000.0),
    st.integers(1, 8),
    st.integers(1, 128),
    st.integers(2, 120),
)
def test_parser_never_raises_and_stays_bounded(ids, scale, max_spans, max_span, max_plan):
    p = PlanParser(TOK, length_scale=scale, max_plan_tokens=max_plan, max_spans=max_spans, max_span_tokens=max_span)
    since_end = 0
    for i in ids:
        out = p.feed(i)
        assert out.kind in ("plan", "content", "tag")
        since_end += 1
        assert since_end <= max_plan  # the guard ends every round within max_plan_tokens
        assert len(p.round_entries) <= max_spans
        if out.end:
            since_end = 0
            entries = p.pop_round()
            assert len(entries) <= max_spans and all(1 <= e.length <= max_span for e in entries)


def test_fused_entry_tokens_parse_like_their_parts():
    """`<promise>-<topic>` and ` N</topic>` are one token each; spelled out they parse the same."""
    text = entry_text("ab", 3) + entry_text("c", 12) + "<sync/>"
    fused = TOK.encode(text)
    assert TOK.token_id("<promise>-<topic>") in fused and TOK.token_id(" 3</topic>") in fused
    assert TOK.decode(fused) == text

    def spell(ids):  # expand every fused token into the tokens it spells
        out = []
        for t in ids:
            piece = TOK.decode([t])
            out += (
                [TOK.token_id("<promise>"), TOK.token_id("-<topic>")]
                if piece == "<promise>-<topic>"
                else [*piece[: -len("</topic>")].encode(), TOK.token_id("</topic>")]
                if piece.endswith("</topic>") and len(piece) > 8
                else [t]
            )
        return out

    spelled = spell(fused)
    assert len(spelled) > len(fused)
    one = TOK.encode(entry_text("c", 3))  # a one-byte topic: 3 autoregressive passes, 6 spelled out
    assert (len(one), len(spell(one))) == (3, 6)

    def entries(ids):
        p, out = PlanParser(TOK, length_scale=10), []
        for t in ids:
            r = p.feed(t)
            if r.entry:
                out.append((r.entry.topic, r.entry.units, r.entry.length))
            if r.end:
                return out, r.end.kind
        return out, None

    assert entries(fused) == entries(spelled) == ([("ab", 3, 30), ("c", 12, 64)], "sync")
