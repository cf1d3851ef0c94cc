"""The per-node launcher of a training job that spans several nodes.

A job whose ``resources.train.processes`` exceed ``resources.gpus_per_node`` runs on
``nodes = processes / gpus_per_node`` nodes (:func:`qrerase.workflow.plan.nodes_of`). Its rule's command
(:func:`qrerase.workflow.launch.launcher`) starts one copy of this module per node with ``srun
--nodes N --ntasks-per-node 1``; each copy runs HF Accelerate's launcher for its node's processes:

``accelerate launch --num_machines N --machine_rank R --num_processes N·G --main_process_ip H
--main_process_port P --rdzv_backend static --same_network --config_file <multi_process.yaml> <script> ...``

- R, the machine rank: ``SLURM_NODEID`` (Slurm's index of the node in the allocation), so global
  ranks are ``R·G … R·G + G − 1`` in node order, the same on every run (a static rendezvous,
  ``torchrun --nnodes N --node_rank R --master_addr H --master_port P``);
- H, the main node: ``QRERASE_MAIN_ADDR`` if set, else the first host of ``SLURM_JOB_NODELIST``
  (``scontrol show hostnames``);
- P: ``QRERASE_MAIN_PORT`` if set, else 20000 + ``SLURM_JOB_ID`` mod 20000 (one port per job, the
  same on every node without any exchange).

The number of nodes comes from ``--nodes`` and must equal ``SLURM_NNODES`` when that is set. Outside
Slurm (the test on one machine), set ``SLURM_NODEID``, ``QRERASE_MAIN_ADDR`` and ``QRERASE_MAIN_PORT``
for each launcher by hand. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = [
    "MAIN_ADDR",
    "MAIN_PORT",
    "main_address",
    "main_port",
    "machine_rank",
    "node_command",
    "slurm_hostnames",
    "main",
]

#: Environment variables that override the main node's address and the rendezvous port.
MAIN_ADDR, MAIN_PORT = "QRERASE_MAIN_ADDR", "QRERASE_MAIN_PORT"


def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}: expected an integer, got {value!r}") from None


def machine_rank(env: Mapping[str, str], nodes: int) -> int:
    """This node's machine rank: ``SLURM_NODEID`` (0 … nodes − 1); a one-line error when it is
    missing, out of range, or ``SLURM_NNODES`` disagrees with ``nodes``."""
    if "SLURM_NODEID" not in env:
        raise ValueError("multinode: SLURM_NODEID is not set (run under srun, or set it for each launcher)")
    if "SLURM_NNODES" in env and _int(env, "SLURM_NNODES") != nodes:
        raise ValueError(f"multinode: the job has {env['SLURM_NNODES']} nodes (SLURM_NNODES), the plan {nodes}")
    rank = _int(env, "SLURM_NODEID")
    if not 0 <= rank < nodes:
        raise ValueError(f"multinode: SLURM_NODEID {rank} is not in 0..{nodes - 1}")
    return rank


def main_address(env: Mapping[str, str], hostnames=None) -> str:
    """The main (machine rank 0) node's address: ``QRERASE_MAIN_ADDR``, else the first host of
    ``SLURM_JOB_NODELIST`` as :func:`slurm_hostnames` expands it (``hostnames(nodelist)``: another
    expansion, for tests)."""
    if env.get(MAIN_ADDR):
        return env[MAIN_ADDR]
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise ValueError(f"multinode: neither {MAIN_ADDR} nor SLURM_JOB_NODELIST is set")
    hosts = list((hostnames or slurm_hostnames)(nodelist))
    if not hosts:
        raise ValueError(f"multinode: SLURM_JOB_NODELIST {nodelist!r} names no host")
    return hosts[0]


def slurm_hostnames(nodelist: str) -> list[str]:
    """The host names of a Slurm node list (``gpu[07-08]`` -> ``gpu07 gpu08``) as Slurm itself expands
    them: ``scontrol show hostnames``, which reads only the node list (no controller). Slurm's own
    parser, present on every node where ``srun`` started this module, rather than a second
    implementation of its syntax (python-hostlist would be one more dependency to keep in step with
    Slurm's). A one-line error where ``scontrol`` is missing or refuses the list."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
    except FileNotFoundError:
        raise ValueError(
            f"multinode: scontrol (Slurm) is not installed here, so SLURM_JOB_NODELIST {nodelist!r} cannot be "
            f"expanded; set {MAIN_ADDR} to the main node's address"
        ) from None
    if out.returncode or not out.stdout.split():  # scontrol exits 0 on an invalid list, saying so on stderr
        reason = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        raise ValueError(f"multinode: scontrol show hostnames {nodelist!r} failed: {reason}")
    return out.stdout.split()


def main_port(env: Mapping[str, str]) -> int:
    """The rendezvous port: ``QRERASE_MAIN_PORT``, else 20000 + ``SLURM_JOB_ID`` mod 20000."""
    if env.get(MAIN_PORT):
        port = _int(env, MAIN_PORT)
    elif env.get("SLURM_JOB_ID"):
        port = 20000 + _int(env, "SLURM_JOB_ID") % 20000
    else:
        raise ValueError(f"multinode: neither {MAIN_PORT} nor SLURM_JOB_ID is set")
    if not 1 <= port <= 65535:
        raise ValueError(f"multinode: port {port} is not in 1..65535")
    return port


def node_command(
    env: Mapping[str, str],
    nodes: int,
    per_node: int,
    accelerate: str,
    config_file: str,
    script: Sequence[str],
    hostnames=None,
) -> list[str]:
    """The ``accelerate launch`` argv of this node (module docstring) for ``script`` (the training
    script and its arguments)."""
    if nodes < 2 or per_node < 1:
        raise ValueError(f"multinode: expected --nodes >= 2 and --processes-per-node >= 1, got {nodes}, {per_node}")
    if not script:
        raise ValueError("multinode: no training script given after --")
    rank = machine_rank(env, nodes)
    return [
        accelerate,
        "launch",
        "--num_machines",
        str(nodes),
        "--machine_rank",
        str(rank),
        "--num_processes",
        str(nodes * per_node),
        "--main_process_ip",
        main_address(env, hostnames),
        "--main_process_port",
        str(main_port(env)),
        "--rdzv_backend",
        "static",
        "--same_network",
        "--config_file",
        config_file,
        *script,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m qrerase.workflow.multinode", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, required=True, help="nodes of the job")
    p.add_argument("--processes-per-node", type=int, required=True, help="processes (GPUs) per node")
    p.add_argument("--accelerate", required=True, help="the accelerate executable")
    p.add_argument("--config_file", required=True, help="the Accelerate launcher config")
    p.add_argument("script", nargs=argparse.REMAINDER, help="-- the training script and its arguments")
    a = p.parse_args(argv)
    script = a.script[1:] if a.script[:1] == ["--"] else a.script
    try:
        cmd = node_command(os.environ, a.nodes, a.processes_per_node, a.accelerate, a.config_file, script)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
