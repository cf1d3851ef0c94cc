"""Memory / GPU plan of a config's jobs, computed from the model's shape and the training recipe.

Pure arithmetic: nothing is downloaded or loaded (the model's shape: :mod:`qrerase.workflow.shapes`).
Bytes throughout; ``GiB = 2**30``. Assumptions (documented in docs/paper-scale.md, checked against measured
tiny models in tests/integration/test_plan.py):

- Static training state: a bf16 / fp16 model trains with fp32 master weights (the engine upcasts it),
  so fp32 weights 4 B + fp32 gradients 4 B + AdamW's two fp32 moments 8 B = 16 B per trainable
  parameter (float32 training: the same 16 B). Where it lives depends on the job's ``backend``
  (:func:`device_bytes`): one process or DDP hold all of it on every GPU (a full replica); FSDP2
  shards it over the processes and gathers one or two layers (and the root group: embeddings, LM
  head) at a time.
- Activations: :func:`layer_activation_bytes` enumerates the tensors transformers' Llama-style decoder
  layer saves for backward per token with SDPA attention (no s x s matrix); gradient checkpointing
  keeps each layer's input and recomputes one layer at a time. The LM head saves the fp32
  log-softmax of the cross-entropy; the peak adds the returned logits and their fp32 gradient.
  Activations scale with the micro-batch, the one thing more processes divide under DDP.
- Frozen reference models (KL, NPO, DPO; SCRUB / Bad Teaching teachers; KGA's models) hold weights
  only (forward under no_grad): replicated under DDP, sharded under FSDP2.
- Inference (evaluate / generation) splits the weights over the job's GPUs (device_map="auto") and
  adds the KV cache and one teacher-forced forward's logits.
- Host memory: one full copy of the weights in the checkpoint dtype (rank 0 loads and saves; the
  others wait on the meta device) + 3 GiB per process (CUDA context, libraries) + 1 GiB data.

A job that does not fit is planned with a note naming the config key to change
(:func:`plan_job`); ``qrerase plan`` and Snakemake's planning refuse such a config
(:func:`qrerase.workflow.plan_config.refusal`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .shapes import ModelShape

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PROCESS_OVERHEAD = 3 * GIB  # per training / inference process on the host (CUDA context, torch, data)
CPU_PROCESS_OVERHEAD = 1 * GIB  # the same for a CPU-only process (no CUDA context)
SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size of a safetensors checkpoint


# ---------------------------------------------------------------------------------------------
# Activation memory
# ---------------------------------------------------------------------------------------------
def layer_activation_bytes(shape: ModelShape, compute_bytes: int) -> int:
    """Bytes one decoder layer saves for backward, per token (a = compute dtype bytes, h, kv, i),
    as enumerated on transformers' Llama layer with SDPA (tests/integration/test_plan.py measures it):

    - 2 RMSNorms: the fp32 input (4h), the fp32 rsqrt (4) and the normalised input to the weight
      product (a·h), each, and their outputs, the inputs of q/k/v and of gate/up (a·h each);
    - attention: rotated q and k and v (a·(h + 2·kv)), SDPA's output, which is the o_proj input
      (a·h), and SDPA's fp32 log-sum-exp (4 x heads);
    - MLP, per active expert: gate, SiLU(gate), up and their product, the down_proj input (4·a·i)
      (non-gated: fc1 out and GELU out, 2·a·i).
    Total 8h + 8 + a·(6h + 2·kv) + 4·heads + a·i·(4 | 2)·experts_per_token.
    """
    h, a = shape.hidden, compute_bytes
    mlp = (4 if shape.gated_mlp else 2) * a * shape.intermediate * shape.experts_per_token
    return 8 * h + 8 + a * (6 * h + 2 * shape.kv_dim) + 4 * shape.heads + mlp


def head_activation_bytes(shape: ModelShape, compute_bytes: int) -> int:
    """Per token at the LM head: the final norm (4h + 4 + a·h), lm_head's input (a·h) and the fp32
    log-softmax of the cross-entropy (4·V)."""
    return 4 * shape.hidden + 4 + 2 * compute_bytes * shape.hidden + 4 * shape.vocab


def saved_activation_bytes(shape: ModelShape, tokens: int, compute_bytes: int, checkpointing: bool) -> int:
    """Bytes autograd holds for backward at the end of the forward pass over ``tokens`` tokens
    (micro-batch x length): every layer's saved tensors, or with gradient checkpointing only each
    layer's input (a·h per token); plus the head's."""
    per_layer = compute_bytes * shape.hidden if checkpointing else layer_activation_bytes(shape, compute_bytes)
    return tokens * (shape.layers * per_layer + head_activation_bytes(shape, compute_bytes))


def activation_bytes(shape: ModelShape, tokens: int, compute_bytes: int, checkpointing: bool) -> int:
    """Peak activation bytes of one forward + backward: the saved tensors, the logits the model
    returns (a·V per token) and their fp32 gradient (4·V), and with checkpointing one layer's
    recomputed tensors during backward."""
    peak = saved_activation_bytes(shape, tokens, compute_bytes, checkpointing)
    peak += tokens * (compute_bytes + 4) * shape.vocab
    if checkpointing:
        peak += tokens * layer_activation_bytes(shape, compute_bytes)
    return peak


# ---------------------------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    """A cluster node: GPUs, their memory, host memory. ``gpus == 0``: a CPU-only job (device cpu)."""

    gpus: int = 8
    gpu_mem_gb: float = 80.0
    host_mem_gb: float = 1000.0


#: Multi-process engines the plan knows (qrerase.engine): ``ddp`` replicates the training state on
#: every GPU; any other (``fsdp``: FSDP2) shards it.
REPLICATED = "ddp"


@dataclass(frozen=True)
class JobSpec:
    """One planned job's recipe, with the engine settings it runs with.

    workload: 'train' (full weights), 'lora', 'infer' (forward / generation) or 'linalg' (CPU, streaming).
    sequences: sequences per example (2: forget + retain batches, or DPO's chosen + rejected).
    references: frozen model copies held during training (KL / NPO / DPO / FLAT in full mode: 1; in LoRA
    mode the reference is the base with the adapter disabled: 0); memory.
    reference_forwards: forward passes through a frozen reference per trained sequence, for the run
    time (a held copy or the adapter-disabled base alike); None: ``references``.
    backend: the multi-process engine (``ddp`` | ``fsdp``; irrelevant with one process).
    section: the config key of the job's own section (e.g. ``tofu.baselines.ga``), named in notes;
    backend_key: the config key its backend comes from, or is best set at (``finetune.backend``);
    hint: what to change when the job fits no single node (e.g. ``use finetune.mode: lora``).
    """

    name: str
    workload: str
    batch_size: int = 1
    max_length: int = 512
    sequences: int = 1
    references: int = 0
    lora_rank: int = 0
    lora_modules: int = 7  # target modules per layer
    checkpointing: bool = False
    micro_batch_size: int | None = None  # None: the largest power of two that fits
    processes: int = 1
    new_tokens: int = 0  # generation (infer)
    backend: str = REPLICATED
    section: str = ""
    backend_key: str = ""
    hint: str = ""
    reference_forwards: int | None = None

    def __post_init__(self):
        if self.workload not in ("train", "lora", "infer", "linalg"):
            raise ValueError(f"job {self.name}: workload must be train | lora | infer | linalg, got {self.workload!r}")
        if self.batch_size < 1 or self.processes < 1 or self.max_length < 1:
            raise ValueError(f"job {self.name}: batch_size, processes and max_length must be >= 1")

    @property
    def processes_key(self) -> str:
        """The config key of the job's process count."""
        return f"resources.{'evaluate' if self.workload == 'infer' else 'train'}.processes"


@dataclass(frozen=True)
class JobPlan:
    """A planned job: what it asks for and the engine settings it runs with (``processes``,
    ``micro_batch`` per process, ``accumulation``, ``backend``, ``checkpointing``; the training
    job's spec passes exactly these, :func:`qrerase.workflow.stages.engine_settings`)."""

    name: str
    processes: int
    gpus: int  # GPUs the job asks for (0: CPU)
    gpus_needed: int  # the fewest GPUs on one node with which it fits (0: none on one node)
    micro_batch: int  # per process; gradient accumulation = batch / (micro_batch x processes)
    accumulation: int
    device_bytes: int  # peak per GPU (CPU jobs: 0)
    host_bytes: int
    fits: bool
    note: str = ""
    backend: str = REPLICATED
    checkpointing: bool = False
    nodes: int = 1  # nodes the job spans (processes / gpus per node when the processes exceed one node)
    nodes_needed: int = 0  # when it fits no single node: the fewest nodes (sharded) with which it fits


#: The most nodes the plan considers for one job.
MAX_NODES = 64


def nodes_of(processes: int, gpus_per_node: int) -> int:
    """Nodes a job of ``processes`` processes spans: 1 when they fit one node (or on the CPU,
    ``gpus_per_node`` 0), else ``processes / gpus_per_node`` (one launcher per node,
    :mod:`qrerase.workflow.multinode`); ``ValueError`` when ``gpus_per_node`` does not divide them."""
    if gpus_per_node <= 0 or processes <= gpus_per_node:
        return 1
    if processes % gpus_per_node:
        raise ValueError(
            f"resources.train.processes: {processes} processes on nodes of {gpus_per_node} GPUs "
            f"(resources.gpus_per_node): expected at most {gpus_per_node} or a multiple of it"
        )
    return processes // gpus_per_node


def lora_params(shape: ModelShape, job: JobSpec) -> int:
    """r x (d_in + d_out) per target module; modules are taken as h x h (an upper bound for k/v, a
    lower bound for the MLP ones, so the average is close for the 7 usual targets)."""
    return shape.layers * job.lora_modules * job.lora_rank * 2 * max(shape.hidden, shape.intermediate // 2)


def accumulation_steps(batch_size: int, micro: int, processes: int) -> int:
    """Micro-batches per process and optimiser step, ``ceil(batch / (micro x processes))``: the
    engine's rule (:func:`qrerase.engine.micro_plan`) for a micro-batch no larger than the
    per-process share ``ceil(batch / processes)``."""
    return max(1, math.ceil(batch_size / (max(1, micro) * processes)))


def device_bytes(
    shape: ModelShape, job: JobSpec, dtype: str, micro: int, processes: int, backend: str | None = None
) -> int:
    """Peak bytes per GPU of ``job`` with ``micro`` sequences per process on ``processes`` GPUs
    under ``backend`` (default ``job.backend``).

    Symbols: a = bytes of the compute dtype; P = parameters; L = one decoder layer's
    (:meth:`ModelShape.layer_params`); R = the root group's (:meth:`ModelShape.root_params`);
    T = trained parameters (train: P; lora: :func:`lora_params`); f = frozen references
    (``job.references``); n = processes; k = gradient accumulation
    (:func:`accumulation_steps`); A = activations of one micro-batch (:func:`activation_bytes`).
    Masters, gradients and AdamW moments are fp32 (16 B per trained parameter); a LoRA job keeps its
    frozen base in the compute dtype and its trained adapters in fp32; it trains under autocast in
    the base dtype, whose cached copies of the adapters (a·T, under 0.5 GiB for 70B at r = 16) are
    not counted.

    - infer: a·P / n (weights split over the GPUs) + KV cache (2·layers·kv_dim·a per token of
      ``max_length + new_tokens``) + one forward's logits ((a + 4)·V per token) + 2·a·h per token.
    - one process (no wrapping; ``backend`` irrelevant):
      train ``16·P + c + f·a·P + A``, lora ``a·P + f·a·P + 16·T + A``, where c = a·P is autocast's
      cached compute-dtype copy of every fp32 weight, held from the forward to its backward (0 when
      a = 4: no autocast).
    - ``ddp``, n > 1: a full replica on every GPU, the one-process terms plus DDP's all-reduce
      buckets, a second copy of the gradients (4·T; ``gradient_as_bucket_view`` is off): train
      ``20·P + c + f·a·P + A``, lora ``a·P + f·a·P + 20·T + A``. Only A shrinks with n (smaller
      micro-batches).
    - FSDP2 (any other backend), n > 1: sharded state + what is gathered at once:
      train ``(16·P + f·a·P) / n + 2·a·L + (1 + f)·a·R + G + A`` with the gathered units = two
      decoder layers' compute-dtype parameters (the current one and the prefetched one), the root
      group (embeddings, LM head, final norm of the model and of each reference: FSDP2 wraps only
      the layers, and the root stays gathered from the first forward to the end of the backward),
      and the unsharded gradients G = a·(L + R) (one layer's, reduce-scattered after its backward,
      and the root's, reduce-scattered at the end) with k = 1, or G = a·P with k > 1: FSDP2 keeps
      every parameter's unsharded gradient across the micro-batches it does not reduce (Accelerate's
      FSDP2 policy reduces in the compute dtype);
      lora ``(a·P + f·a·P + 16·T) / n + 2·a·L + (1 + f)·a·R + G + A`` with G = 4·T when k > 1
      (the adapters' unsharded fp32 gradients), else 0.
    """
    a = DTYPE_BYTES[dtype]
    P = shape.count_params()
    backend = job.backend if backend is None else backend
    tokens = micro * job.sequences * job.max_length
    if job.workload == "infer":
        kv = 2 * shape.layers * shape.kv_dim * a * micro * (job.max_length + job.new_tokens)
        logits = (a + 4) * shape.vocab * micro * job.max_length
        return math.ceil(a * P / processes) + kv + logits + 2 * a * shape.hidden * micro * job.max_length
    acts = activation_bytes(shape, tokens, a, job.checkpointing)
    refs = job.references * a * P
    accum = accumulation_steps(job.batch_size, micro, processes)
    trained = P if job.workload == "train" else lora_params(shape, job)
    base = 16 * P if job.workload == "train" else a * P + 16 * trained  # one process's static state
    if processes == 1 or backend == REPLICATED:
        cache = a * P if job.workload == "train" and a < 4 else 0  # autocast's copies of the fp32 weights
        buckets = 4 * trained if processes > 1 else 0  # DDP's all-reduce buckets
        return base + buckets + cache + refs + acts
    root = (1 + job.references) * a * shape.root_params()
    gathered = 2 * a * shape.layer_params() + root
    if job.workload == "train":
        grads = a * P if accum > 1 else a * (shape.layer_params() + shape.root_params())
    else:
        grads = 4 * trained if accum > 1 else 0
    return (base + refs) // processes + gathered + grads + acts


def host_bytes(shape: ModelShape, job: JobSpec, dtype: str, processes: int, on_gpu: bool) -> int:
    """Host memory: a GPU job holds one full copy of the weights in the checkpoint dtype (loading and
    saving on rank 0) + 3 GiB per process + 1 GiB of data; a CPU job holds its device bytes + 1 GiB per
    process; linalg: erase_merged streams two shards (read + edited) + 1 GiB; factors (``lora_rank``
    set) hold both adapters' factors and their decompositions in fp32 (3 x 4 B x 2 adapters) + 1 GiB."""
    a = DTYPE_BYTES[dtype]
    P = shape.count_params()
    if job.workload == "linalg" and job.lora_rank:  # factors: both adapters' A, B and their QR / SVD in fp32
        return 3 * 4 * 2 * lora_params(shape, job) + GIB
    if job.workload == "linalg":  # erase_merged: one shard read, one edited
        return 2 * min(a * P, SHARD_BYTES) + GIB
    if on_gpu:
        return a * P * (1 + job.references) + processes * PROCESS_OVERHEAD + GIB
    micro = job.micro_batch_size or job.batch_size
    return device_bytes(shape, job, dtype, min(micro, job.batch_size), 1) + CPU_PROCESS_OVERHEAD + GIB


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def plan_job(shape: ModelShape, job: JobSpec, dtype: str, node: Node) -> JobPlan:
    """Micro-batch, GPUs and peak memory of one job, and the engine settings it runs with.

    The per-process share of a training batch is ``ceil(batch / processes)`` (as the engine splits
    it). micro-batch: ``job.micro_batch_size`` (capped at the share) if set, else on a GPU the
    largest power of two <= the share (dividing it when the processes divide the batch) whose peak
    fits ``node.gpu_mem_gb``, on the CPU the whole share; accumulation: :func:`accumulation_steps`.
    gpus_needed: the fewest of 1, 2, 4, ..., node.gpus with which the job fits one node, sharded
    (FSDP2) when more than one (0 when none does); nodes_needed: then, for a training job, the fewest
    whole nodes (up to :data:`MAX_NODES`, sharded) with which it fits. processes above ``node.gpus``
    (a multiple of it, training only) span ``processes / node.gpus`` nodes (``nodes``), with host
    memory planned per node. A job that does not fit gets a note naming the
    config key to change: ``backend: fsdp`` for a DDP replica that does not fit a GPU, a smaller
    ``micro_batch_size``, more processes, or ``job.hint`` when no node of ``node.gpus`` GPUs fits it.
    """
    share = math.ceil(job.batch_size / job.processes)
    training = job.workload in ("train", "lora")
    if job.workload == "linalg" or node.gpus == 0:
        host = host_bytes(shape, job, dtype, job.processes, on_gpu=False)
        if job.workload == "linalg":
            micro = 0
        elif job.workload == "infer":
            micro = min(job.micro_batch_size or job.batch_size, job.batch_size)
        else:
            micro = min(job.micro_batch_size or share, share)
        accum = accumulation_steps(job.batch_size, micro, job.processes) if training else 1
        fits = host <= node.host_mem_gb * GIB
        note = "" if fits else f"needs {host / GIB:.0f} GiB of host memory (resources.node_mem_gb)"
        return JobPlan(job.name, job.processes, 0, 0, micro, accum, 0, host, fits, note, job.backend, job.checkpointing)
    cap = node.gpu_mem_gb * GIB

    def peak(m: int, procs: int, backend: str) -> int:
        return device_bytes(shape, job, dtype, m, procs, backend)

    def micro_for(procs: int, backend: str) -> int:
        """The micro-batch that runs on ``procs`` GPUs under ``backend``; 0 when it does not fit."""
        part = math.ceil(job.batch_size / procs)
        if job.micro_batch_size:
            m = min(job.micro_batch_size, part) if training else min(job.micro_batch_size, job.batch_size)
            return m if peak(m, procs, backend) <= cap else 0
        m = _pow2_floor(part) if training else _pow2_floor(job.batch_size)
        exact = training and job.batch_size % procs == 0  # micro x accum x procs == batch
        while m >= 1 and (peak(m, procs, backend) > cap or (exact and part % m)):
            m //= 2
        return m

    sharded = "fsdp" if job.backend == REPLICATED else job.backend
    gpus = [g for g in (1 << i for i in range(8)) if g <= node.gpus]
    needed = next((g for g in gpus if micro_for(g, job.backend if g == 1 else sharded)), 0)
    spread = training and needed == 0  # fits no single node: the fewest nodes, sharded, that it fits
    nodes_needed = next((n for n in range(2, MAX_NODES + 1) if micro_for(n * node.gpus, sharded)), 0) if spread else 0
    micro = micro_for(job.processes, job.backend)
    fitting = micro > 0
    if not micro:  # what would run: the configured micro-batch, else the smallest
        micro = min(job.micro_batch_size, share if training else job.batch_size) if job.micro_batch_size else 1
    dev = peak(micro, job.processes, job.backend)
    layout = job.processes <= node.gpus or (training and job.processes % node.gpus == 0)
    nodes = job.processes // node.gpus if job.processes > node.gpus and layout else 1
    host = host_bytes(shape, job, dtype, job.processes // nodes, on_gpu=True)  # per node
    host_fits = host <= node.host_mem_gb * GIB
    fits = fitting and layout and host_fits
    accum = accumulation_steps(job.batch_size, micro, job.processes) if training else 1
    note = ""
    if not fits:
        over = f"{dev / GIB:.1f} GiB per GPU > {node.gpu_mem_gb:g} GB (resources.gpu_mem_gb)"
        if not layout:
            what = "a multiple of it (one launcher per node)" if training else "no more (inference runs on one node)"
            note = (
                f"{job.processes} processes on nodes of {node.gpus} GPUs: set {job.processes_key} "
                f"<= resources.gpus_per_node or {what}"
            )
        elif not host_fits:
            note = f"needs {host / GIB:.0f} GiB of host memory > resources.node_mem_gb ({node.host_mem_gb:g})"
        elif training and job.processes > 1 and job.backend == REPLICATED and micro_for(job.processes, sharded):
            note = (
                f"backend ddp keeps a full replica of the training state on every GPU ({over}); "
                f"set {job.backend_key or 'finetune.backend'}: fsdp"
            )
        elif (
            job.micro_batch_size
            and micro_for(job.processes, job.backend) == 0
            and peak(1, job.processes, job.backend) <= cap
        ):
            note = f"micro_batch_size {micro} does not fit ({over}); lower {job.section}.micro_batch_size or null it"
        elif needed == 0 and nodes_needed and job.processes < nodes_needed * node.gpus:
            note = f"does not fit one node ({node.gpus} x {node.gpu_mem_gb:g} GB, {over})"
            note += f"; {job.hint}" if job.hint else ""
            with_fsdp = " with backend fsdp" if job.backend == REPLICATED else ""
            note += f"; or {nodes_needed} nodes: {job.processes_key}: {nodes_needed * node.gpus}{with_fsdp}"
        elif needed == 0:
            note = f"does not fit one node ({node.gpus} x {node.gpu_mem_gb:g} GB, {over})"
            note += f"; {job.hint}" if job.hint else ""
        elif needed > job.processes:
            with_fsdp = " with backend fsdp" if job.backend == REPLICATED and needed > 1 and training else ""
            note = f"{over}: needs {job.processes_key} >= {needed}{with_fsdp}"
        else:
            note = over
    return JobPlan(
        job.name,
        job.processes,
        job.processes,
        needed,
        micro,
        accum,
        dev,
        host,
        fits,
        note,
        job.backend,
        job.checkpointing,
        nodes,
        nodes_needed,
    )
