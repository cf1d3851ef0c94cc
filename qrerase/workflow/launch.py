"""How a training rule starts its job, and how the started script gets its job back.

A training rule runs its script through a ``shell:`` command (so ``snakemake -n -p`` shows it):

- one process: ``"$QRERASE_PYTHON" "$QRERASE_WORKFLOW/workflow_scripts/<script>" --threads T --log L --job
  '<json>'``;
- ``resources.<class>.processes`` N > 1: HF Accelerate's launcher, ``accelerate launch --num_processes N
  --main_process_port 0 --config_file envs/accelerate/multi_process.yaml <script> ...``, which starts N
  workers through ``torch.distributed.run`` and sets ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` /
  ``MASTER_ADDR`` / ``MASTER_PORT`` for each (port 0: a free port, so jobs on one node never collide).
  With ``model.device: cpu`` the command is prefixed by ``ACCELERATE_USE_CPU=true``: the workers'
  ``Accelerator`` then joins a gloo process group on the CPU. (``accelerate launch --cpu`` is not used:
  it selects Accelerate's single-process launcher, which starts one process whatever ``--num_processes``.)

The command names the interpreter, the launcher and the workflow directory through environment variables
(:data:`ENV_PYTHON`, :data:`ENV_ACCELERATE`, :data:`ENV_WORKFLOW`, set by ``rules/common.smk`` when the
Snakefile is read), never by absolute path: Snakemake compares a shell rule's command text (its ``code``
rerun trigger), so a checkout (and its ``.venv``) moved elsewhere plans the same commands and re-runs
nothing. Every word is quoted (:func:`shell_word`): a checkout at ``/home/me/my runs/qr-erase`` works.

The job spec (``--job``) is one JSON object built at planning time by ``rules/common.smk``
(:func:`job_spec`): the job's inputs, outputs, params, wildcards and the config entries its params come
from. :func:`load_job` turns it and the command line back into an object with the attributes of
Snakemake's ``snakemake`` script object (``input``, ``output``, ``params``, ``wildcards``, ``log``,
``threads``, ``rule``, ``config``, ``scriptdir``), so scripts and :func:`qrerase.workflow.job.job` treat
both alike. Nothing here imports torch or Snakemake.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .provenance import config_subset

__all__ = [
    "LAUNCH_CONFIG",
    "ENV_PYTHON",
    "ENV_ACCELERATE",
    "ENV_WORKFLOW",
    "shell_word",
    "NamedList",
    "LaunchedJob",
    "launcher",
    "job_spec",
    "load_job",
    "rank",
    "world_size",
    "is_main_process",
]

#: The Accelerate launcher config shipped in the repository (relative to the workflow directory).
LAUNCH_CONFIG = "envs/accelerate/multi_process.yaml"
#: Environment variables of the launch command (set by ``rules/common.smk``): the Python interpreter, the
#: ``accelerate`` executable and the workflow directory (the checkout holding ``workflow_scripts/``).
ENV_PYTHON, ENV_ACCELERATE, ENV_WORKFLOW = "QRERASE_PYTHON", "QRERASE_ACCELERATE", "QRERASE_WORKFLOW"

_ENV_WORD = re.compile(r"\$[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z0-9._-]+)*")


def shell_word(value: str) -> str:
    """``value`` as one shell word: ``$NAME`` or ``$NAME/a/path`` (an environment variable, with a path
    below it) in double quotes, so the shell expands it whatever it holds (spaces included); anything
    else quoted literally (:func:`shlex.quote`)."""
    return f'"{value}"' if _ENV_WORD.fullmatch(value) else shlex.quote(value)


# ---------------------------------------------------------------------------------------------
# The process's place in the job (set by the launcher; a plain `python` run is rank 0 of 1).
# ---------------------------------------------------------------------------------------------
def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"environment variable {name}: expected an integer, got {value!r}") from None


def rank() -> int:
    """This process's global rank (``RANK``, set by ``accelerate launch`` / ``torchrun``); 0 when unset."""
    return _env_int("RANK", 0)


def world_size() -> int:
    """The job's number of processes (``WORLD_SIZE``); 1 when unset."""
    return _env_int("WORLD_SIZE", 1)


def is_main_process() -> bool:
    """True on rank 0, the one process that writes the job's outputs, log and provenance record."""
    return rank() == 0


# ---------------------------------------------------------------------------------------------
# The launch command (rules/common.smk).
# ---------------------------------------------------------------------------------------------
def launcher(processes: int, device: str, python: str, accelerate: str, config_file: str, nodes: int = 1) -> str:
    """The command prefix that runs a training script with ``processes`` processes on ``nodes`` nodes.

    ``python``, ``accelerate`` and ``config_file`` are each one word, quoted here (:func:`shell_word`:
    ``$QRERASE_PYTHON`` stays an environment variable). ``processes == 1``: the Python interpreter
    itself. Above 1 on one node: ``accelerate launch`` with the shipped launcher config and a free
    rendezvous port. On ``nodes`` > 1 (inside the job's Slurm allocation): ``srun --nodes N
    --ntasks-per-node 1 --overlap --kill-on-bad-exit 1`` starts :mod:`qrerase.workflow.multinode` once
    per node, which runs ``accelerate launch`` for the node's ``processes / nodes`` processes.
    ``device == "cpu"`` adds ``ACCELERATE_USE_CPU=true`` (gloo workers on the CPU). Raises ValueError
    for ``processes < 1``, ``nodes < 1`` or processes that ``nodes`` does not divide.
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"resources.<class>.processes: expected an integer >= 1, got {processes!r}")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1 or processes % nodes:
        raise ValueError(f"nodes: expected an integer >= 1 that divides the {processes} processes, got {nodes!r}")
    prefix = "ACCELERATE_USE_CPU=true " if device == "cpu" and processes > 1 else ""
    if nodes > 1:
        srun = ["srun", "--nodes", str(nodes), "--ntasks-per-node", "1", "--overlap", "--kill-on-bad-exit", "1"]
        node = [python, "-m", "qrerase.workflow.multinode", "--nodes", str(nodes)]
        node += ["--processes-per-node", str(processes // nodes), "--accelerate", accelerate]
        node += ["--config_file", config_file, "--"]
        return prefix + " ".join(shell_word(p) for p in (*srun, *node))
    if processes == 1:
        return shell_word(python)
    parts = [
        accelerate,
        "launch",
        "--num_processes",
        str(processes),
        "--main_process_port",
        "0",
        "--config_file",
        config_file,
    ]
    return prefix + " ".join(shell_word(p) for p in parts)


# ---------------------------------------------------------------------------------------------
# The job spec: built at planning time, read back by the launched script.
# ---------------------------------------------------------------------------------------------
def _named(items: Iterable[Any], named: Mapping[str, Any]) -> dict[str, Any]:
    def plain(v):
        return [str(x) for x in v] if isinstance(v, (list, tuple)) else str(v)

    return {"values": [str(v) for v in items], "names": {k: plain(v) for k, v in named.items()}}


def _nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1, "c": 2}`` -> ``{"a": {"b": 1}, "c": 2}``."""
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = out
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def job_spec(rule: str, *, input: Any, output: Any, wildcards: Any, params: Mapping[str, Any], config: Mapping) -> str:
    """The JSON job spec of one job (compact, keys sorted).

    ``input`` / ``output`` are Snakemake's named lists (iterable, with ``.items()`` for the named
    entries); ``params`` the job's evaluated params. ``config`` is reduced to the entries the params
    come from (:func:`qrerase.workflow.provenance.config_subset`), nested again, so the provenance record
    the job writes holds the same config subset as a ``script:`` job's.
    """
    params = json.loads(json.dumps(dict(params), default=str))
    spec = {
        "rule": rule,
        "input": _named(input, dict(input.items())),
        "output": _named(output, dict(output.items())),
        "wildcards": {k: str(v) for k, v in dict(wildcards.items()).items()},
        "params": params,
        "config": _nested(json.loads(json.dumps(config_subset(config, params), default=str))),
    }
    if config.get("plugins"):
        spec["plugins"] = list(config["plugins"])
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


class NamedList(list):
    """A list of values whose named entries are also attributes, like Snakemake's ``Namedlist``.

    Names are instance attributes, so a name that is also a list method (``index``, ``count``) gives
    the entry, as in Snakemake.
    """

    def __init__(self, values: Sequence[Any] = (), names: Mapping[str, Any] | None = None):
        super().__init__(values)
        self._names = dict(names or {})
        for name, value in self._names.items():
            setattr(self, name, value)

    def __getitem__(self, key):
        return self._names[key] if isinstance(key, str) else super().__getitem__(key)

    def keys(self):
        return self._names.keys()

    def items(self):
        return self._names.items()

    def get(self, key: str, default: Any = None) -> Any:
        return self._names.get(key, default)


class LaunchedJob:
    """The job of a shell-launched script: the attributes of Snakemake's ``snakemake`` object.

    ``threads`` is this process's share, ``max(1, job_threads // world_size)``; ``job_threads`` the
    rule's threads (what the provenance record holds); ``world_size`` the launcher's process count.
    """

    def __init__(self, spec: Mapping[str, Any], *, threads: int, log: Sequence[str], scriptdir: str):
        self.rule = spec["rule"]
        self.input = NamedList(spec["input"]["values"], spec["input"]["names"])
        self.output = NamedList(spec["output"]["values"], spec["output"]["names"])
        self.params = NamedList(list(spec["params"].values()), spec["params"])
        self.wildcards = NamedList(list(spec["wildcards"].values()), spec["wildcards"])
        self.log = NamedList(list(log))
        self.config = dict(spec["config"])
        self.scriptdir = scriptdir
        self.world_size = world_size()
        self.job_threads = int(threads)
        self.threads = max(1, self.job_threads // self.world_size)


def load_job(argv: Sequence[str] | None = None) -> LaunchedJob:
    """The job of this script from its command line (``--threads --log --job``); the spec's plug-in
    modules are imported (:func:`qrerase.registry.load_plugins`)."""
    parser = argparse.ArgumentParser(description="a qr-erase workflow job (started by its Snakemake rule)")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--log", action="append", default=[])
    parser.add_argument("--job", required=True, help="the job spec (JSON), built by rules/common.smk")
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        spec = json.loads(args.job)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--job: not a JSON job spec ({exc})") from None
    missing = [k for k in ("rule", "input", "output", "wildcards", "params", "config") if k not in spec]
    if missing:
        raise ValueError(f"--job: the job spec lacks {', '.join(missing)}")
    from .. import registry

    registry.load_plugins(spec.get("plugins", []))
    scriptdir = str(Path(sys.argv[0]).resolve().parent)
    return LaunchedJob(spec, threads=args.threads, log=args.log, scriptdir=scriptdir)


# ---------------------------------------------------------------------------------------------
# The training rules' shell command and job spec param (rules/common.smk `launch`, `launch_params`)
# ---------------------------------------------------------------------------------------------
def export_launch_env(python: str, workflow_dir: str) -> None:
    """Name this interpreter, its ``accelerate`` and the checkout in the environment (:data:`ENV_PYTHON`,
    :data:`ENV_ACCELERATE`, :data:`ENV_WORKFLOW`), which the commands of :func:`launch_command` use
    instead of absolute paths: Snakemake's ``code`` trigger compares a shell rule's command text, so a
    moved checkout (with its .venv) re-runs nothing, and every word is quoted."""
    accelerate = Path(python).parent / "accelerate"
    os.environ.update(
        {
            ENV_PYTHON: python,
            ENV_ACCELERATE: str(accelerate) if accelerate.exists() else "accelerate",
            ENV_WORKFLOW: workflow_dir,
        }
    )


def launch_command(config: Mapping, script: str, resource_class: str = "train", conda: bool = False) -> str:
    """The shell command of a training rule: ``workflow_scripts/<script>`` with the rule's job spec
    (``params.job``, :func:`job_params`), through ``accelerate launch`` when ``resources.<class>.processes``
    > 1, started once per node (srun, :mod:`qrerase.workflow.multinode`) when the processes span several
    nodes. ``conda``: under ``--software-deployment-method conda`` the environment's own ``python`` and
    ``accelerate``, else this interpreter's (:func:`export_launch_env`)."""
    from .plan import nodes_of
    from .stages import node_of, processes  # the planning modules import torch-free; lazily: no cycle

    python, accelerate = ("python", "accelerate") if conda else (f"${ENV_PYTHON}", f"${ENV_ACCELERATE}")
    n = processes(config, resource_class)  # resources.<class>.processes, as the plan reads it
    device = config["model"].get("device", "cpu")
    prefix = launcher(
        n, device, python, accelerate, f"${ENV_WORKFLOW}/{LAUNCH_CONFIG}", nodes_of(n, node_of(config, device).gpus)
    )
    script_path = shell_word(f"${ENV_WORKFLOW}/workflow_scripts/{script}")
    return f"{prefix} {script_path} --threads {{threads}} --log {{log:q}} --job {{params.job:q}}"


def evaluate_param(value: Any, wildcards: Any, input: Any, output: Any) -> Any:
    """A rule param as Snakemake evaluates it: a value as is, a function called with the wildcards and
    those of ``input`` / ``output`` its signature names after them (Snakemake's own rule for params)."""
    if not callable(value):
        return value
    import inspect

    given = {"wildcards": wildcards, "input": input, "output": output}
    names = list(inspect.signature(value).parameters)
    return value(wildcards, **{n: given[n] for n in names[1:] if n in given})


def job_params(config: Mapping, rule: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A training rule's ``params``, plus ``job``: a param function giving the JSON job spec
    (:func:`job_spec`) of rule ``rule`` with the other params evaluated (:func:`evaluate_param`), which
    the command of :func:`launch_command` passes on."""

    def job(wildcards, input, output):
        values = {k: evaluate_param(v, wildcards, input, output) for k, v in params.items()}
        return job_spec(rule, input=input, output=output, wildcards=wildcards, params=values, config=config)

    return {**params, "job": job}
