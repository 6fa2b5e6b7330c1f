"""Abuse: replay every bad input, race and hostile file of issue 18 against `solm` as a user would.

What: each case runs `python -m solm ...` as a subprocess in its own temp folder (copies of the
shipped traces and checkpoint, a notes file of the user's), with a timeout, and is classified:
  clean_error    exit 2 and one stderr line `solm <command>: error: ...` (what bad input must give)
  correct        an expected success whose result was checked (a sweep's error row, a resume)
  traceback      a traceback, or exit 1 ("internal error (a bug)"), or any other exit status
  data_lost      a file the case must not touch (inputs, the user's files) changed or vanished
  hang           still running at the timeout (killed with its process group)
  long_line      exit 2 and one line, but over MAX_LINE characters (a value echoed whole)
  wrong_result   exit 0 where an error was due, or a success whose figures are wrong
Why: the regression tests (tests/cli/test_data_loss.py, test_bad_input.py) call `main()` in
process; this drives the real command line, with real FIFOs, /dev/zero and concurrent writers.

    python bench/abuse.py            # prints each case, then one JSON line
    python bench/abuse.py --quick    # the same cases (they take about a minute or two)

Output: {"bench": "abuse", "cases", "clean_errors", "correct", "tracebacks", "data_lost", "hangs",
"wrong_results", "long_lines"}; exit 1 if any case is not clean_error or correct.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEQ = ROOT / "traces" / "sequential-reverse_words"
PD = ROOT / "traces" / "planned_diffusion-word_facts"
XLA_H100 = ROOT / "simulator" / "data" / "xla-gemm" / "h100-sxm.csv"
CKPT = ROOT / "checkpoints" / "sequential-tiny"
LOCK = ".solm.lock"
MAX_LINE = 400  # an error line longer than this echoes a runaway value (profiler.errors.shorten_words)
LONG_VALUE = "v" * 3000


@dataclass
class Case:
    name: str
    argv: list[str]  # solm arguments, run in the case's folder
    expect: str = "error"  # "error": exit 2, one line; "ok": exit 0 and `check` passes
    setup: Callable[[Path], None] | None = None
    check: Callable[[Path, subprocess.CompletedProcess], bool] | None = None
    timeout_s: float = 60.0
    concurrent: list[str] = field(default_factory=list)  # a writer started first, running alongside
    env: dict[str, str] = field(default_factory=dict)  # environment variables set for solm (e.g. SOLM_SDPA)


def digest(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.name == LOCK or p.is_symlink() or not p.is_file():
            continue
        out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run_solm(
    argv: list[str], cwd: Path, timeout_s: float, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess | None:
    """`python -m solm ARGV` in `cwd` (with `extra_env` set); None when it ran past `timeout_s`
    (its process group killed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SOLM_DEBUG": "0", **(extra_env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "solm", *argv],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def folder(base: Path) -> Path:
    """The user's folder: a trace `t`, a PD trace `pd`, a folder of traces `runs/`, a checkpoint
    `ckpt`, and a notes file. Everything in it is protected unless a case names what it may write."""
    shutil.copytree(SEQ, base / "t")
    shutil.copytree(PD, base / "pd")
    shutil.copytree(SEQ, base / "runs" / "a")
    shutil.copytree(PD, base / "runs" / "b")
    shutil.copytree(CKPT, base / "ckpt")
    (base / "notes.txt").write_text("the user's notes\n")
    return base


def refusal(command: str, stderr: str) -> str:
    """How a refusal (exit 2) reads: "one_line" (the one line `solm <command>: error: ...` of at most
    MAX_LINE characters bad input must give), "long_line" (that line, longer) or "not_one_line"."""
    lines = stderr.strip().splitlines()
    if len(lines) != 1 or not lines[0].startswith(f"solm {command}: error: "):
        return "not_one_line"
    return "one_line" if len(lines[0]) <= MAX_LINE else "long_line"


def classify(case: Case, base: Path, before: dict, r: subprocess.CompletedProcess | None) -> str:
    after = digest(base)
    lost = [k for k, v in before.items() if after.get(k) != v]
    if lost:
        return "data_lost"
    if r is None:
        return "hang"
    if "Traceback" in r.stderr or r.returncode not in (0, 2):
        return "traceback"
    if case.expect == "error":
        if r.returncode == 0:
            return "wrong_result"
        return {"one_line": "clean_error", "long_line": "long_line"}.get(refusal(case.argv[0], r.stderr), "traceback")
    if r.returncode != 0 or (case.check and not case.check(base, r)):
        return "wrong_result"
    return "correct"


def run_case(case: Case) -> tuple[str, str]:
    with tempfile.TemporaryDirectory(prefix="solm-abuse-") as tmp:
        base = folder(Path(tmp))
        if case.setup:
            case.setup(base)
        before = digest(base)
        first = None
        if case.concurrent:  # the first writer: started, given time to take its lock, left running
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            first = subprocess.Popen(
                [sys.executable, "-m", "solm", *case.concurrent],
                cwd=base,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            wait_for_lock(base / case.concurrent[case.concurrent.index("--out") + 1], first)
        r = run_solm(case.argv, base, case.timeout_s, case.env)
        if first is not None:  # the race happened only if the first was still writing: then stop it
            raced = first.poll() is None
            if raced:
                os.killpg(first.pid, signal.SIGINT)  # a capture cut short keeps its finished requests
            try:
                first.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(first.pid, signal.SIGKILL)
                return "hang", "the first writer did not stop on SIGINT"
            if not raced:
                return "wrong_result", "the first writer finished before the second started (no race tested)"
        outcome = classify(case, base, before, r)
        detail = "timeout" if r is None else (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return outcome, detail[:160]


def wait_for_lock(out: Path, proc: subprocess.Popen, limit_s: float = 120.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s and proc.poll() is None:
        if (out / LOCK).exists() and ((out / "parts").exists() or (out / "results.jsonl").exists()):
            return
        time.sleep(0.05)


# ---- the cases ------------------------------------------------------------------------------
def _json_last(r: subprocess.CompletedProcess) -> dict:
    return json.loads(r.stdout.strip().splitlines()[-1])


def _meta(key: str, value) -> Callable[[Path], None]:
    def setup(base: Path) -> None:
        meta = json.loads((base / "t" / "meta.json").read_text())
        meta[key] = value
        (base / "t" / "meta.json").write_text(json.dumps(meta))

    return setup


def _replace_meta(make: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(base: Path) -> None:
        (base / "t" / "meta.json").unlink()
        make(base / "t" / "meta.json")

    return setup


def _graph(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def setup(base: Path) -> None:
        graphs = json.loads((base / "t" / "graph.json").read_text())
        edit(graphs[next(iter(graphs))])
        (base / "t" / "graph.json").write_text(json.dumps(graphs))

    return setup


def _requests(col: str, value: float, table: str = "requests") -> Callable[[Path], None]:
    def setup(base: Path) -> None:
        import pandas as pd

        df = pd.read_parquet(base / "t" / f"{table}.parquet")
        df.loc[0, col] = value
        df.to_parquet(base / "t" / f"{table}.parquet", index=False)

    return setup


def _text_column(col: str) -> Callable[[Path], None]:
    """requests.`col` rewritten as text of the same numbers ("0.25" for 0.25)."""

    def setup(base: Path) -> None:
        import pandas as pd

        df = pd.read_parquet(base / "t" / "requests.parquet")
        df[col] = df[col].astype(str)
        df.to_parquet(base / "t" / "requests.parquet", index=False)

    return setup


def _empty_steps(base: Path) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(base / "t" / "steps.parquet")
    pq.write_table(table.slice(0, 0), base / "t" / "steps.parquet")


def _sweep_resumed(base: Path, r: subprocess.CompletedProcess) -> bool:
    lines = (base / "sw" / "results.jsonl").read_text().splitlines()
    return len(lines) == 2 and _json_last(r)["configs"] == 2


def _slow_gemms(base: Path) -> None:
    import pandas as pd

    t = pd.read_csv(XLA_H100)
    t["time_s"] = 2.0 * t.m * t.n * t.k / t.bf16_flops_per_s * 1e6
    t.drop(columns="bf16_flops_per_s").to_csv(base / "slow.csv", index=False)


def _edited_sweep(base: Path) -> None:
    run_solm([*SWEEP, "--out", "sw"], base, 120)
    results = base / "sw" / "results.jsonl"
    first, second = results.read_text().splitlines()
    results.write_text(json.dumps({**json.loads(first), "max_seqs": "1"}) + "\n" + second + "\n")


CAPTURE = ["capture", "--model", "tiny-2l", "--n", "2", "--max-tokens", "8"]
SIM = ["simulate", "t", "--hardware", "h100-sxm", "--num-requests", "4"]
# a small sweep of the shipped trace `t` (two configurations), without its --out
SWEEP = ["sweep", "t", "--hardware", "h100-sxm", "--max-seqs", "1,2", "--num-requests", "4", "--workers", "1"]


def cases() -> list[Case]:
    """Every case, by what it guards against: data loss, crashes and hangs, silent wrong results."""
    return [
        *overwrite_cases(),
        *concurrent_cases(),
        *crash_cases(),
        *hostile_input_cases(),
        *wrong_result_cases(),
        *runtime_sweep_cases(),
        *long_value_cases(),
    ]


def overwrite_cases() -> list[Case]:
    """Data loss: an output named over the user's inputs, folders or files."""
    return [
        Case("capture --out . --force", [*CAPTURE, "--out", ".", "--force"]),
        Case("simulate --out . --force", [*SIM, "--out", ".", "--force"]),
        Case("capture --out PARENT --force", [*CAPTURE, "--out", "runs", "--force"]),
        Case("simulate --out PARENT --force", [*SIM, "--out", "runs", "--force"]),
        Case("simulate T --out T --force", [*SIM, "--out", "t", "--force"]),
        Case("simulate T --out T/sub --force", [*SIM, "--out", "t/sub", "--force"]),
        Case(
            "capture --structure-from T --out T --force",
            ["capture", "--model", "tiny-2l", "--structure-from", "t", "--n", "1", "--out", "t", "--force"],
        ),
        Case("export --perfetto T/meta.json --force", ["export", "t", "--perfetto", "t/meta.json", "--force"]),
        Case("export --perfetto existing file", ["export", "t", "--perfetto", "notes.txt"]),
        Case("diff --html T/meta.json --force", ["diff", "t", "t", "--html", "t/meta.json", "--force"]),
        Case("diff --html existing file", ["diff", "t", "t", "--html", "notes.txt"]),
        Case("train --out existing checkpoint", ["train", "--out", "ckpt", "--steps", "1"]),
        Case("train --out . --force", ["train", "--out", ".", "--force", "--steps", "1"]),
    ]


def concurrent_cases() -> list[Case]:
    """Data loss: two writers into one --out, and a sweep resumed under another spelling of its trace."""
    return [
        Case(
            "two captures into one --out",
            [*CAPTURE, "--out", "busy", "--force"],
            concurrent=["capture", "--model", "tiny-2l", "--n", "5000", "--max-tokens", "64", "--out", "busy"],
        ),
        Case(
            "two sweeps into one --out",
            ["sweep", "t", "--hardware", "h100-sxm", "--out", "sw2"],
            concurrent=[
                "sweep",
                "t",
                "pd",
                "--hardware",
                "a100-80g,h100-sxm,h200",
                "--max-seqs",
                "1,2,4,8,16,32",
                "--rate",
                "1,2,4,8",
                "--num-requests",
                "1024",  # long enough that it is still writing when the second starts (64 was not, on an idle machine)
                "--workers",
                "1",
                "--out",
                "sw2",
            ],
        ),
        Case(
            "sweep resume, path spelled differently",
            [
                "sweep",
                "./t/",
                "--hardware",
                "h100-sxm",
                "--max-seqs",
                "1,2",
                "--num-requests",
                "4",
                "--workers",
                "1",
                "--out",
                "sw",
                "--json",
            ],
            expect="ok",
            check=_sweep_resumed,
            setup=lambda b: run_solm([*SWEEP, "--out", "sw", "--json"], b, 120),
        ),
    ]


def crash_cases() -> list[Case]:
    """Crashes and hangs: settings no pass fits, damaged traces and unusable outputs."""
    return [
        Case(
            "simulate --max-batch-tokens below a pass",
            ["simulate", "pd", "--hardware", "h100-sxm", "--max-batch-tokens", "2"],
        ),
        Case(
            "sweep --max-batch-tokens below one trace's pass: an error row",
            [
                "sweep",
                "t",
                "pd",
                "--hardware",
                "h100-sxm",
                "--max-batch-tokens",
                "40",
                "--num-requests",
                "4",
                "--workers",
                "1",
                "--json",
            ],
            expect="ok",
            check=lambda b, r: _json_last(r)["errors"] == 1 and _json_last(r)["ok"] == 1,
        ),
        Case("simulate a trace with empty steps", [*SIM], setup=_empty_steps),
        Case("validate a trace with empty steps", ["validate", "t"], setup=_empty_steps),
        Case("simulate --out unwritable", [*SIM, "--out", "/proc/solm-abuse"]),
        Case("export --perfetto DIR", ["export", "t", "--perfetto", "runs"]),
        Case("diff --html DIR", ["diff", "t", "t", "--html", "runs"]),
        Case(
            "meta.json model of the wrong type", ["simulate", "t", "--hardware", "h100-sxm"], setup=_meta("model", "x")
        ),
        Case("meta.json field of the wrong type (inspect)", ["inspect", "t"], setup=_meta("device", [1, 2])),
        Case(
            "deeply nested meta.json",
            ["inspect", "t"],
            setup=_replace_meta(lambda p: p.write_text("[" * 200000 + "]" * 200000)),
        ),
    ]


def hostile_input_cases() -> list[Case]:
    """Crashes and hangs: absurd flags, hostile files (FIFOs, /dev/zero) and an unreachable cluster."""
    return [
        Case("--set hbm_capacity_bytes=1e400", [*SIM, "--set", "hbm_capacity_bytes=1e400"]),
        Case("capture --temperature nan", [*CAPTURE, "--temperature", "nan", "--out", "c"]),
        Case("capture --device bogus", [*CAPTURE, "--device", "bogus", "--out", "c"]),
        Case("SOLM_SDPA=bogus capture", [*CAPTURE, "--out", "c"], env={"SOLM_SDPA": "bogus"}),
        Case("SOLM_SDPA=<3,000 characters> capture", [*CAPTURE, "--out", "c"], env={"SOLM_SDPA": LONG_VALUE}),
        Case(
            "SOLM_SDPA=math capture records it",
            [*CAPTURE, "--out", "c"],
            env={"SOLM_SDPA": "math"},
            expect="ok",
            check=lambda b, r: json.loads((b / "c" / "meta.json").read_text())["device"]["sdpa"] == "math",
        ),
        Case("capture --n 1000000000", ["capture", "--n", "1000000000", "--out", "c"], timeout_s=60),
        Case("capture --threads -1", [*CAPTURE, "--threads", "-1", "--out", "c"]),
        Case(
            "capture --task var_tracking --n 5000 (more than it can draw)",
            ["capture", "--system", "tip", "--task", "var_tracking", "--n", "5000", "--out", "c"],
            timeout_s=120,
        ),
        Case(
            "diff with a FIFO meta.json",
            ["diff", "t", "runs/a"],
            timeout_s=30,
            setup=_replace_meta(lambda p: os.mkfifo(p)),
        ),
        Case(
            "diff with /dev/zero as meta.json",
            ["diff", "runs/a", "t"],
            timeout_s=30,
            setup=_replace_meta(lambda p: p.symlink_to("/dev/zero")),
        ),
        Case(
            "calibrate a FIFO GEMM table",
            ["calibrate", "g.csv", "--hardware", "h100-sxm", "--out", "cal.json"],
            timeout_s=30,
            setup=lambda base: os.mkfifo(base / "g.csv"),
        ),
        Case(
            "calibrate --out /proc/x.json (os.access says yes to root)",
            ["calibrate", "g.csv", "--hardware", "h100-sxm", "--out", "/proc/solm-abuse.json"],
            setup=lambda base: shutil.copy(XLA_H100, base / "g.csv"),
        ),
        Case(
            "calibrate --out its own table --force",
            ["calibrate", "g.csv", "--hardware", "h100-sxm", "--out", "g.csv", "--force"],
            setup=lambda base: shutil.copy(XLA_H100, base / "g.csv"),
        ),
        Case(
            "cost --gemm-calibration /dev/zero",
            ["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gemm-calibration", "/dev/zero"],
            timeout_s=30,
        ),
        Case(
            "export with a FIFO meta.json",
            ["export", "t", "--perfetto", "x.json"],
            timeout_s=30,
            setup=_replace_meta(lambda p: os.mkfifo(p)),
        ),
        Case(
            "sweep of 159,201 configurations (399 max-seqs x 399 rates)",
            [
                "sweep",
                "t",
                "--hardware",
                "h100-sxm",
                "--max-seqs",
                ",".join(map(str, range(1, 400))),
                "--rate",
                ",".join(map(str, range(1, 400))),
                "--workers",
                "1",
            ],
            timeout_s=60,
        ),
        Case("simulate --model '' (taken for no --model)", [*SIM, "--model", ""]),
        Case(
            "sweep resume: results.jsonl row edited to another type",
            [*SWEEP, "--out", "sw"],
            setup=_edited_sweep,
        ),
        Case(
            "sweep --backend ray --address 127.0.0.1:1",
            ["sweep", "t", "--hardware", "h100-sxm", "--backend", "ray", "--address", "127.0.0.1:1"],
            timeout_s=90,
        ),
    ]


def long_value_cases() -> list[Case]:
    """A value of 3,000 characters for each flag whose check once echoed it whole (a 3,000-character
    error line): names, numbers, choices and paths."""
    sim = ["simulate", "--model", "llama-3-8b", "--hardware", "h100-sxm"]
    flags = [
        ([*sim, "--replicas", "2", "--router"], "simulate --router"),
        ([*sim, "--pp-schedule"], "simulate --pp-schedule"),
        ([*sim, "--gemm-calibration"], "simulate --gemm-calibration"),
        ([*sim, "--out"], "simulate --out"),
        (["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--tp"], "cost --tp"),
        (["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--kv-tokens"], "cost --kv-tokens"),
        (["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--calibrate-from"], "cost --calibrate-from"),
        ([*CAPTURE, "--out", "c", "--system"], "capture --system"),
        ([*CAPTURE, "--out", "c", "--task"], "capture --task"),
        ([*CAPTURE, "--out", "c", "--device"], "capture --device"),
        ([*CAPTURE, "--out", "c", "--knob"], "capture --knob"),
        ([*CAPTURE, "--out"], "capture --out"),
        (["train", "--out", "c", "--system"], "train --system"),
        (["validate", "t", "--calibrate-from"], "validate --calibrate-from"),
        (["diff", "t", "pd", "--html"], "diff --html"),
    ]
    return [Case(f"{name} <3,000 characters>", [*argv, LONG_VALUE]) for argv, name in flags]


def wrong_result_cases() -> list[Case]:
    """Silent wrong results: non-finite or tiny settings, and damaged traces that must not pass as valid."""
    cyc = _graph(lambda g: g["links"].append({"source": g["nodes"][-1]["id"], "target": g["nodes"][0]["id"]}))
    dangling = _graph(lambda g: g["links"].append({"source": "ghost", "target": g["nodes"][0]["id"]}))
    return [
        Case("--set launch_overhead_s=inf", [*SIM, "--set", "launch_overhead_s=inf"]),
        Case("capture --counters-hz nan", [*CAPTURE, "--counters-hz", "nan", "--out", "c"], timeout_s=60),
        Case(
            "cost --tokens 1e20 (a pass of 1e15 ms)",
            ["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--tokens", "1" + "0" * 20],
        ),
        Case(
            "simulate --workload, a row wider than its header (columns read shifted)",
            ["simulate", "--workload", "w.csv", "--structure-from", "t", "--hardware", "h100-sxm"],
            setup=lambda base: (base / "w.csv").write_text(
                "arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5,7\n"
            ),
        ),
        Case(
            "calibrate times 1e6x too slow (us in time_s)",
            ["calibrate", "slow.csv", "--hardware", "h100-sxm", "--out", "cal.json"],
            setup=_slow_gemms,
            timeout_s=120,
        ),
        Case(
            "cost --calibrate-from a CPU trace for h100-sxm",
            ["cost", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--calibrate-from", "t"],
        ),
        Case("simulate --rate 1e-300", [*SIM, "--rate", "1e-300"]),
        Case("inspect --validate: cyclic graph", ["inspect", "t", "--validate"], setup=cyc, expect="invalid"),
        Case("inspect --validate: dangling link", ["inspect", "t", "--validate"], setup=dangling, expect="invalid"),
        Case(
            "inspect --validate: infinite e2e",
            ["inspect", "t", "--validate"],
            setup=_requests("e2e_s", float("inf")),
            expect="invalid",
        ),
        Case(
            "inspect --validate: negative ttft",
            ["inspect", "t", "--validate"],
            setup=_requests("ttft_s", -1.0),
            expect="invalid",
        ),
        Case(
            "inspect --validate: negative arrival",
            ["inspect", "t", "--validate"],
            setup=_requests("arrival_s", -2.0),
            expect="invalid",
        ),
        Case(
            "inspect --validate: quality 1.5",
            ["inspect", "t", "--validate"],
            setup=_requests("quality_score", 1.5),
            expect="invalid",
        ),
        Case(
            "inspect --validate: negative emitted_tokens",
            ["inspect", "t", "--validate"],
            setup=_requests("emitted_tokens", -3, table="steps"),
            expect="invalid",
        ),
        Case("simulate a trace whose e2e_s column is text", [*SIM], setup=_text_column("e2e_s")),
        Case(
            "simulate --workload --columns ',,,' (no mapping at all)",
            ["simulate", "--workload", "w.csv", "--structure-from", "t", "--hardware", "h100-sxm", "--columns", ",,,"],
            setup=lambda base: (base / "w.csv").write_text("ts,in,out\n0,10,5\n"),
        ),
        Case("diff an invalid trace (cycle)", ["diff", "runs/a", "t"], setup=cyc),
        Case(
            "export an invalid trace (quality 1.5)",
            ["export", "t", "--perfetto", "x.json"],
            setup=_requests("quality_score", 1.5),
        ),
    ]


def _small_checkpoint(change: str) -> Callable[[Path], None]:
    """A well-formed checkpoint `small` of tiny-2l with `change` (ModelConfig fields), made in a child
    (this script's folder holds a runtime.py that would shadow the package)."""
    code = (
        "import dataclasses; from runtime.checkpoint import save_checkpoint; from runtime.model import ModelConfig, "
        f"TinyLM; save_checkpoint(TinyLM(dataclasses.replace(ModelConfig.from_name('tiny-2l'), {change})), 'small')"
    )

    def setup(base: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-c", code], cwd=base, env=env, check=True, timeout=120)

    return setup


def _stopped_before_first_request(base: Path) -> None:
    for name in ("requests.parquet", "steps.parquet", "tokens.parquet", "graph.json"):
        (base / "t" / name).unlink()
    (base / "t" / "parts").mkdir()
    _meta("complete", False)(base)


def _steps(edit: Callable) -> Callable[[Path], None]:
    def setup(base: Path) -> None:
        import pandas as pd

        edit(pd.read_parquet(base / "t" / "steps.parquet")).to_parquet(base / "t" / "steps.parquet", index=False)

    return setup


def runtime_sweep_cases() -> list[Case]:
    """The runtime/profiler sweep (capture, train, inspect, diff, export, dashboard): checkpoints too
    small for the task, a diverging run, an empty value, damaged traces that passed as valid."""
    small = ["capture", "--model", "small", "--n", "1", "--max-tokens", "2", "--out", "c"]
    return [
        Case("capture a checkpoint of a smaller vocabulary", small, setup=_small_checkpoint("vocab_size=100")),
        Case("capture a checkpoint of 8 positions", small, setup=_small_checkpoint("max_positions=8")),
        Case(
            "train --lr 1000 (diverges)",
            ["train", "--lr", "1000", "--steps", "30", "--batch-size", "4", "--json", "--out", "o"],
        ),
        Case(
            "capture: no request fits the KV pool",
            ["capture", "--n", "2", "--max-tokens", "2", "--concurrency", "1", "--kv-budget-mib", "0.04", "--out", "c"],
        ),
        Case(
            "capture --system sot --concurrency 1", ["capture", "--system", "sot", "--concurrency", "1", "--out", "c"]
        ),
        Case(
            "capture --knob block_sparse=nan",
            ["capture", "--system", "planned_diffusion", "--knob", "block_sparse=nan", "--out", "c"],
        ),
        Case(
            "capture --top-p 1e-300", [*CAPTURE, "--temperature", "1", "--top-p", "1e-300", "--out", "c"], expect="ok"
        ),
        Case("train --init ''", ["train", "--init", "", "--steps", "1", "--out", "o"]),
        Case("diff t ''", ["diff", "t", ""]),
        Case("dashboard a folder twice", ["dashboard", "t", "./t/", "--dry-run"]),
        Case("inspect a trace stopped before its first request", ["inspect", "t"], setup=_stopped_before_first_request),
        Case(
            "inspect --validate: unknown status",
            ["inspect", "t", "--validate"],
            setup=_requests("status", "x"),
            expect="invalid",
        ),
        Case(
            "inspect --validate: e2e 1e308",
            ["inspect", "t", "--validate"],
            setup=_requests("e2e_s", 1e308),
            expect="invalid",
        ),
        Case(
            "inspect --validate: passes back in time",
            ["inspect", "t", "--validate"],
            setup=_steps(lambda d: d.assign(start_s=d["start_s"].to_numpy()[::-1])),
            expect="invalid",
        ),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="accepted for make bench QUICK=1 (same cases)")
    ap.parse_args()
    counts: Counter = Counter()
    all_cases = cases()
    for case in all_cases:
        t0 = time.perf_counter()
        if case.expect == "invalid":  # inspect --validate: exit 2 with its problems listed (not one line)
            case.expect = "ok"
            outcome, detail = _run_invalid(case)
        else:
            outcome, detail = run_case(case)
        counts[outcome] += 1
        print(f"{outcome:12s} {time.perf_counter() - t0:5.1f} s  {case.name}: {detail}", flush=True)
    figures = {
        "bench": "abuse",
        "cases": len(all_cases),
        "clean_errors": counts["clean_error"],
        "correct": counts["correct"],
        "tracebacks": counts["traceback"],
        "data_lost": counts["data_lost"],
        "hangs": counts["hang"],
        "wrong_results": counts["wrong_result"],
        "long_lines": counts["long_line"],
    }
    print(json.dumps(figures))
    return 0 if counts["clean_error"] + counts["correct"] == len(all_cases) else 1


def _run_invalid(case: Case) -> tuple[str, str]:
    """`inspect --validate` on a damaged trace must exit 2 and name the problem (was: valid)."""
    with tempfile.TemporaryDirectory(prefix="solm-abuse-") as tmp:
        base = folder(Path(tmp))
        case.setup(base)
        before = digest(base)
        r = run_solm(case.argv, base, case.timeout_s)
        if digest(base) != before:
            return "data_lost", ""
        if r is None:
            return "hang", "timeout"
        if "Traceback" in r.stderr or r.returncode not in (0, 2):
            return "traceback", (r.stderr.strip().splitlines() or [""])[-1][:160]
        problems = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("problem:")]
        if r.returncode != 2 or not problems:
            return "wrong_result", "passed validation"
        return "correct", problems[0][:160]


if __name__ == "__main__":
    sys.exit(main())
