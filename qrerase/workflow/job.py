"""Glue between Snakemake jobs and the library: logging, config → dataclass, model loading.

Workflow scripts stay thin: they call :func:`job` to route output into the rule's log file and to
fix seeds and threads, then call library functions. Nothing here is needed to use the library.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..bench import phases
from ..bench.phases import cpu_line
from ..config import model_options
from . import provenance
from .launch import is_main_process, world_size

__all__ = ["job", "template_from", "load_for_eval", "load_checkpoint", "resume_dir", "resume_key"]

log = logging.getLogger("qrerase")


@contextlib.contextmanager
def job(snakemake: Any, seed: int | None = None) -> Iterator[logging.Logger]:
    """Run a Snakemake job body with stdout/stderr (tqdm bars, warnings) appended to its log file.

    Seeds and the torch thread count are fixed here (from the rule's params / threads) so that two
    runs of the same job give identical artifacts. An exception is logged with a one-line summary
    and re-raised, so Snakemake marks the job failed and removes its outputs; the log gets the traceback
    above that line, and the terminal only the line and the log's path (:func:`_one_line`; the whole
    traceback with ``QRERASE_DEBUG=1``).

    Provenance: existing records of the job's outputs are deleted on entry; after the body succeeded
    every input and output is hashed and one record per output is written atomically under
    ``results/provenance/records/`` (:mod:`qrerase.workflow.provenance`). A failed job leaves no record.

    A multi-process job (``accelerate launch``, :mod:`qrerase.workflow.launch`): every rank runs the
    body (seeded alike, with its share of the threads); rank 0 alone appends to the log file and
    writes the record (with ``world_size``); the other ranks log to stderr.

    The config's ``plugins`` are imported first (their methods' labels and implementations).
    """
    main = is_main_process()
    log_file = snakemake.log[0] if len(snakemake.log) and main else None
    stream = open(log_file, "a", encoding="utf-8") if log_file else sys.stderr  # closed at the end (unless stderr)
    old_out, old_err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = stream
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    startup = time.process_time()  # the CPU the process spent before the job: start-up and imports
    start = time.time()
    outputs = [str(o) for o in snakemake.output]
    if main:
        provenance.remove_records(outputs)
    config = getattr(snakemake, "config", None)
    if isinstance(config, dict) and config.get("plugins"):  # read before recording: not a param's source
        from .. import registry

        registry.load_plugins(config["plugins"])
    recording = provenance.RecordingDict(config) if isinstance(config, dict) else None
    if recording is not None:
        snakemake.config = recording
    previous_handler = _stop_on_sigterm()
    try:
        if seed is not None:
            from ..engine.determinism import set_determinism

            set_determinism(int(seed), int(snakemake.threads))
        log.info("rule %s started (threads=%s)", snakemake.rule, snakemake.threads)
        yield log
        end = time.time()
        log.info("rule %s finished in %.1f s", snakemake.rule, end - start)
        if main:
            with phases.phase("record"):
                _write_provenance(snakemake, config or {}, recording, seed, start, end)
        log.info("%s", cpu_line(snakemake.rule, startup, phases.totals(), time.process_time()))
    except Stopped:
        line = f"rule {snakemake.rule} stopped by SIGTERM (a pre-emption, scancel or kill): {_resume_state(snakemake)}"
        log.error("%s", line)
        if log_file:
            print(line, file=old_err, flush=True)
        raise SystemExit(128 + signal.SIGTERM) from None
    except Exception as exc:
        if log_file:  # the traceback into the log, above the one line that ends it
            log.info("traceback of the failure:\n%s", traceback.format_exc().rstrip())
        log.error("rule %s failed: %s: %s", snakemake.rule, type(exc).__name__, exc)
        if not os.environ.get(DEBUG):
            sys.excepthook = _one_line(snakemake.rule, log_file)
        raise
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)
        if recording is not None:
            snakemake.config = config
        log.removeHandler(handler)
        sys.stdout, sys.stderr = old_out, old_err
        if log_file:
            stream.close()


#: Set (to anything) to see a failed job's whole traceback on the terminal, not only its one line.
DEBUG = "QRERASE_DEBUG"


class Stopped(BaseException):
    """A job told to stop (SIGTERM): a BaseException, so no ``except Exception`` in a library swallows it."""


def _raise_stopped(signum, frame):
    raise Stopped()


def _stop_on_sigterm():
    """Make SIGTERM raise :class:`Stopped` in the job body (main thread only); the previous handler, or
    None where none was installed. The resume directory (:func:`qrerase.engine.resuming`) is kept, as after
    any exception, and :func:`job` ends the process with one line and exit status 143."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_stopped)


def _resume_state(snakemake: Any) -> str:
    """Where a stopped job's resume states are, for its one line (no key computed: :func:`_resume_parent`)."""
    parent = _resume_parent(snakemake)
    states = sorted(parent.rglob("step-*")) if parent.is_dir() else []
    if states:
        return f"resume state kept in {parent}; the same snakemake command resumes from it"
    return "no resume state was saved yet; the same snakemake command restarts it"


def _one_line(rule: str, log_file: str | None):
    """The ``sys.excepthook`` of a job process whose body failed: the exception, uncaught, ends the
    process (exit status 1, so Snakemake marks the job failed) and prints one line naming its cause
    and the log that holds the traceback, instead of the traceback (:data:`DEBUG` shows it)."""

    def hook(kind, value, tb):
        where = f"traceback in {log_file}" if log_file else f"set {DEBUG}=1 for the traceback"
        print(f"rule {rule} failed: {kind.__name__}: {value} ({where})", file=sys.stderr, flush=True)

    return hook


def _workflow_dir(scriptdir: Path) -> Path:
    """The checkout holding a script's directory: the parent of its ``workflow_scripts`` folder (a track's
    scripts are in ``workflow_scripts/<track>/``); the directory's parent for a script elsewhere."""
    for folder in (scriptdir, *scriptdir.parents):
        if folder.name == "workflow_scripts":
            return folder.parent
    return scriptdir.parent


def _write_provenance(snakemake: Any, config: dict, recording, seed, start: float, end: float) -> None:
    params = dict(snakemake.params.items())
    n_positional = len(snakemake.params) - len(params)  # Snakemake lists positional params first
    if n_positional > 0:
        params["_positional"] = list(snakemake.params)[:n_positional]
    # The checkout holding the rules: scripts live in <workflow>/workflow_scripts/ (a track's in a folder there).
    scriptdir = getattr(snakemake, "scriptdir", None)
    workflow_dir = _workflow_dir(Path(scriptdir)) if scriptdir else Path(__file__).resolve().parents[1]
    record = provenance.build_record(
        rule=snakemake.rule,
        wildcards=dict(snakemake.wildcards.items()),
        params=params,
        config=config,
        inputs=[str(i) for i in snakemake.input],
        outputs=[str(o) for o in snakemake.output],
        seed=seed,
        threads=getattr(snakemake, "job_threads", snakemake.threads),
        world_size=world_size(),
        start=start,
        end=end,
        workflow_dir=workflow_dir,
        accessed=recording.accessed if recording is not None else (),
    )
    written = provenance.write_records(record)
    log.info("provenance: %d record(s), e.g. %s", len(written), written[0])


def template_from(model_cfg: dict, tokenizer: Any = None):
    """The prompt template of config ``model.template``: its four strings, or ``chat`` (the tokenizer's
    own chat template, :meth:`qrerase.text.lm.PromptTemplate.from_chat_template`)."""
    from ..text.lm import PromptTemplate

    if model_cfg["template"] == "chat":
        if tokenizer is None:
            raise ValueError("model.template: chat needs the model's tokenizer")
        return PromptTemplate.from_chat_template(tokenizer)
    return PromptTemplate.from_dict(model_cfg["template"])


def load_for_eval(model_dir: str | os.PathLike, adapter_dir: str | os.PathLike | None, model_cfg: dict):
    """Load a checkpoint (and optionally apply a PEFT adapter on top) for evaluation.

    With ``model.device`` ``auto`` / ``cuda`` and several visible GPUs the model is spread across them
    (``device_map="auto"``, ``max_memory``: :func:`qrerase.engine.placement.inference_placement`).
    """
    from ..text.models import load_model, load_tokenizer

    dtype, device = model_options(model_cfg)
    model = load_model(str(model_dir), dtype=dtype, device=device, spread=True)
    tokenizer = load_tokenizer(str(model_dir))
    if adapter_dir is not None:
        from peft import PeftModel

        if not (Path(adapter_dir) / "adapter_config.json").is_file():
            raise ValueError(f"{adapter_dir}: not a PEFT adapter directory (no adapter_config.json)")
        if not (Path(adapter_dir) / "adapter_model.safetensors").is_file():  # PEFT would unpickle a .bin
            raise ValueError(f"{adapter_dir}: no adapter_model.safetensors (pickle adapters are not supported)")
        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()
    return model, tokenizer


def load_checkpoint(model_dir: str | os.PathLike, dtype: str = "float32", device: str = "cpu"):
    """(model, tokenizer) of a causal-LM checkpoint, in eval mode: :func:`qrerase.text.models.load_model`
    (spread over several GPUs as in :func:`load_for_eval`) and its tokenizer. A track with its own kind
    of model loads it with its own loader (the speech track: :func:`qrerase.tracks.speech.model.load_speech_model`)."""
    from ..text.models import load_model, load_tokenizer

    return load_model(str(model_dir), dtype=dtype, device=device, spread=True), load_tokenizer(str(model_dir))


#: The library's sources on the training path (relative to the package): their bytes make the code
#: version in a job's resume key (:func:`resume_key`), so states saved by other training code are not resumed.
TRAINING_CODE = (
    "engine",
    "models",
    "config.py",
    "io.py",
    "baselines",
    "method",
    "text",
    "tracks",
    "workflow/job.py",
)


def training_code_version() -> str:
    """sha256 (hex) of the sources named by :data:`TRAINING_CODE` (relative path and bytes of each)."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for entry in TRAINING_CODE:
        path = package / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            digest.update(f"{f.relative_to(package).as_posix()}\n".encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()


#: Inputs up to this size are fingerprinted by their sha256 in :func:`resume_key`; larger ones
#: (model shards) by size and mtime, which a rewrite changes, so the key stays cheap at any scale.
HASHED_INPUT_BYTES = 64 << 20
#: Weight files, fingerprinted by size and mtime whatever their size: every rank of a job builds the
#: key, and under FSDP2 only rank 0 may read the weights (:func:`qrerase.text.models.load_model`).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".distcp")


def _file_fingerprint(f: Path) -> list:
    st = f.stat()
    if st.st_size <= HASHED_INPUT_BYTES and f.suffix not in WEIGHT_SUFFIXES:
        return [st.st_size, hashlib.sha256(f.read_bytes()).hexdigest()]
    return [st.st_size, st.st_mtime_ns]


def _input_fingerprint(path: str) -> list:
    """(relative path, fingerprint) of a file, or of every file under a folder (sorted): the sha256 of
    files up to :data:`HASHED_INPUT_BYTES`, else, and for weight files (:data:`WEIGHT_SUFFIXES`) of any
    size, (bytes, mtime in ns)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file())
        return [[path, f.relative_to(p).as_posix(), *_file_fingerprint(f)] for f in files]
    if p.is_file():
        return [[path, "", *_file_fingerprint(p)]]
    return [[path, "absent"]]


def _script_digest(snakemake: Any) -> str:
    """sha256 of the running workflow script (``sys.argv[0]`` inside the job's ``scriptdir``), else ``""``."""
    scriptdir = getattr(snakemake, "scriptdir", None)
    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    if not scriptdir or script is None or not script.is_file() or script.parent != Path(scriptdir).resolve():
        return ""
    return hashlib.sha256(script.read_bytes()).hexdigest()


def resume_key(snakemake: Any) -> str:
    """16 hex digits of the sha256 of what determines a job's training: rule, wildcards, params (the
    hyperparameters, seed and engine settings of the job spec), a fingerprint of every input
    (:func:`_input_fingerprint`), :func:`training_code_version` and the workflow script's bytes."""
    params = getattr(snakemake, "params", None)
    named = dict(params.items()) if params is not None and hasattr(params, "items") else {}
    positional = list(params)[: len(params) - len(named)] if params is not None and hasattr(params, "__len__") else []
    spec = {
        "rule": str(snakemake.rule),
        "wildcards": dict(snakemake.wildcards.items()),
        "params": named,
        "positional": positional,
        "inputs": [_input_fingerprint(str(i)) for i in getattr(snakemake, "input", [])],
        "code": training_code_version(),
        "script": _script_digest(snakemake),
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _resume_parent(snakemake: Any) -> Path:
    """``<root>/.resume/<rule>/<wildcards>``: the folder of a job's resume keys (:func:`resume_dir`)."""
    first = Path(str(snakemake.output[0])) if len(snakemake.output) else Path(".")
    root = first.parts[0] if len(first.parts) > 1 else "."
    wildcards = ",".join(f"{k}={v}" for k, v in snakemake.wildcards.items()) or "_"
    return Path(root) / ".resume" / str(snakemake.rule) / wildcards


def resume_dir(snakemake: Any) -> Path:
    """The job's resume directory, outside its declared outputs:
    ``<root>/.resume/<rule>/<wildcards>/<key>`` with ``<root>`` the first component of its first
    output (``results``), the wildcards joined as ``name=value`` by ``,`` (``_`` without wildcards) and
    ``<key>`` :func:`resume_key` (job spec, inputs, training code). A killed job rerun with anything
    of these changed gets a new, empty directory; the states of other keys for the same rule and
    wildcards are stale and removed here (by rank 0), saying so in the log. Use with
    :func:`qrerase.engine.resuming`."""
    parent = _resume_parent(snakemake)
    key = resume_key(snakemake)
    if parent.is_dir() and is_main_process():
        for stale in sorted(parent.iterdir()):
            if stale.name != key:
                log.info("removing resume state %s: saved by a different job spec, input or training code", stale)
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink(missing_ok=True)
    return parent / key
