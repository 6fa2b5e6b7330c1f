"""`skeleton`: skeleton-then-expand baseline (Skeleton-of-Thought, Ning et al. 2023) on the same
model family and the same interpreter.

The model first writes its whole skeleton: the main thread decodes its promises (topic and length
of every point) with no thread running (phase `plan`). When the main thread reaches `<sync/>` (or
its end), every point is expanded **in one batch**: all threads advance together, one query row
each, with the same visibility and positions as under `pasta` (each point sees the prompt and the
skeleton up to its own promise). Then the main thread writes the closing part.

So the only difference from `pasta` is the schedule: PASTA starts a thread the moment its
promise is written, overlapping expansion with planning; skeleton-then-expand waits for the full
plan. Knobs are those of `pasta`.
"""

from __future__ import annotations

from runtime.engines.pasta import MAIN, Layout, PastaEngine


class SkeletonEngine(PastaEngine):
    name = "skeleton"
    default_model = "pasta-fast"
    default_task = "word_facts"

    def new_layout(self, prompt: list[int]) -> Layout:
        return Layout(prompt, self.tok, self.max_threads, self.max_chunk_tokens, defer_threads=True)

    def schedule(self, lay: Layout) -> None:
        main = lay.streams[MAIN]
        if main.waiting or main.done:  # the skeleton is complete: expand every point at once
            lay.release_threads()

    def phase(self, lay: Layout, batch: list[int]) -> str:
        if all(lay.fed[i].stream == MAIN for i in batch) and lay.unmerged and not lay.unmerged_started():
            return "plan"  # writing the skeleton: points promised, none expanded yet
        return super().phase(lay, batch)
