"""Mutation-round tests of runtime/server.py and runtime/serve_capture.py.

All on the tiny untrained model (`tiny_model`) with the server's `FakeClock`: no wall time."""

from __future__ import annotations

from runtime.engines import GenerationConfig, SequentialEngine
from runtime.serve_capture import LoadConfig, make_scheduler
from runtime.server import FakeClock, Server

LONG = "abcdefghijklmnopqrstuvwxyz"  # a prompt of more rows than a 4-token budget


class NoStop(SequentialEngine):
    """Exactly `max_tokens` tokens a request, whatever the random model samples."""

    def is_stop(self, token_id: int) -> bool:
        return False


def seq(model, tok, max_tokens: int = 3, page_size: int = 4) -> NoStop:
    return NoStop(model, tok, GenerationConfig(max_tokens=max_tokens, page_size=page_size))


def test_a_load_capture_chunks_prefills_only_when_told(tiny_model, tok):
    """`--chunked-prefill` off (LoadConfig's default, what meta.serving records) runs a prompt over
    the token budget whole; on, in chunks. Was: the scheduler's own default (on) whatever the flag,
    so every load capture chunked while its meta said it did not (and `solm validate` replayed it
    unchunked)."""
    for chunked in (False, True):
        load = LoadConfig(concurrency=1, max_batch_tokens=4, chunked_prefill=chunked)
        sched = make_scheduler(load)
        assert sched.chunked_prefill is chunked
        server = Server(seq(tiny_model, tok), max_pages=64, scheduler=sched, clock=FakeClock())
        out = server.serve([(0.0, LONG)])
        assert any(e.chunk for p in out["passes"] for e in p.entries) is chunked
        assert out["requests"][0].completion.status != "error"
