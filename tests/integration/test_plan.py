"""The memory plan (qrerase.workflow.plan) against measured tiny models, and `qrerase plan` on every
shipped config."""

import pytest
import torch
from support import REPO as ROOT
from support.shipped import shipped_config
from transformers import LlamaConfig, LlamaForCausalLM

from qrerase.cli import main
from qrerase.workflow.plan import GIB, JobSpec, Node, nodes_of, plan_job, saved_activation_bytes
from qrerase.workflow.plan_config import RESOURCE_CLASSES, load_config, plan_config, rule_resources
from qrerase.workflow.shapes import KNOWN_SHAPES, ModelShape, resolve_shape, shape_from_hf_config

TOLERANCE = 0.15  # relative; the enumeration matches transformers' Llama to the byte today


def measured_saved_bytes(shape: ModelShape, batch: int, length: int, dtype, checkpointing: bool) -> int:
    """Bytes of the distinct non-parameter storages autograd saves in a forward pass of a real
    transformers Llama (saved-tensor hooks), with labels (the cross-entropy)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        vocab_size=shape.vocab,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=length,
    )
    model = LlamaForCausalLM(cfg).to(dtype)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                storages[st.data_ptr()] = max(storages.get(st.data_ptr(), 0), st.nbytes())
        return t

    ids = torch.randint(0, shape.vocab, (batch, length))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()  # the saved tensors were real: backward runs
    return sum(storages.values())


SHAPES = [
    (ModelShape("a", 2, 64, 256, 500, 4, 4), 2, 32),
    (ModelShape("b", 3, 128, 512, 3000, 4, 2), 4, 64),
    (ModelShape("c", 4, 96, 384, 1000, 6, 2), 2, 128),
]


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,batch,length", SHAPES)
def test_activation_estimate_matches_measured(shape, batch, length, dtype, checkpointing):
    measured = measured_saved_bytes(shape, batch, length, dtype, checkpointing)
    estimate = saved_activation_bytes(shape, batch * length, dtype.itemsize, checkpointing)
    assert abs(estimate - measured) <= TOLERANCE * measured, (estimate, measured)


def test_adamw_state_is_16_bytes_per_parameter():
    """fp32 weights + grads + AdamW's two moments after one real step: the plan's 16 B/param."""
    shape = ModelShape("t", 2, 64, 256, 500, 4, 2)
    model = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=64,
            intermediate_size=256,
            num_hidden_layers=2,
            vocab_size=500,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 500, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    state = sum(t.nbytes for s in opt.state.values() for t in s.values() if t.dim() > 0)
    total = sum(p.nbytes + p.grad.nbytes for p in model.parameters()) + state
    assert n == shape.count_params()
    assert total == 16 * n


@pytest.mark.parametrize(
    "name,published_b",
    [
        ("meta-llama/Meta-Llama-3-8B", 8.03),
        ("meta-llama/Meta-Llama-3-70B", 70.55),
        ("mistralai/Mixtral-8x7B-v0.1", 46.70),
        ("meta-llama/Llama-2-7b-chat-hf", 6.74),
        ("CohereForAI/aya-23-8B", 8.03),
    ],
)
def test_known_shapes_count_published_parameters(name, published_b):
    assert KNOWN_SHAPES[name].count_params() / 1e9 == pytest.approx(published_b, rel=0.01)


def test_shape_from_local_config_json(tmp_path):
    LlamaConfig(
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        vocab_size=500,
        num_attention_heads=4,
        num_key_value_heads=2,
    ).save_pretrained(tmp_path)
    shape = resolve_shape({"name_or_path": str(tmp_path)})
    assert (shape.layers, shape.hidden, shape.kv_heads, shape.vocab) == (2, 64, 2, 500)
    with pytest.raises(ValueError, match="model.shape"):
        resolve_shape({"name_or_path": "nobody/unknown-model"})


def test_70b_full_finetune_does_not_fit_a_node_and_points_at_lora():
    shape, node = KNOWN_SHAPES["meta-llama/Meta-Llama-3-70B"], Node(8, 80.0, 1000.0)
    hint = "use finetune.mode: lora"
    full = JobSpec("finetune", "train", 32, 500, processes=8, checkpointing=True, backend="fsdp", hint=hint)
    full = plan_job(shape, full, "bfloat16", node)
    assert not full.fits and full.gpus_needed == 0 and "finetune.mode: lora" in full.note
    lora = JobSpec("lora", "lora", 32, 500, lora_rank=16, processes=8, checkpointing=True, backend="fsdp")
    assert plan_job(shape, lora, "bfloat16", node).fits and plan_job(shape, lora, "bfloat16", node).gpus == 8


def test_a_training_job_over_one_node_is_planned_on_several():
    shape, node = KNOWN_SHAPES["meta-llama/Meta-Llama-3-70B"], Node(8, 80.0, 1000.0)
    spec = dict(workload="train", batch_size=32, max_length=500, checkpointing=True, backend="fsdp", hint="use lora")
    eight = plan_job(shape, JobSpec("finetune", processes=8, **spec), "bfloat16", node)
    assert not eight.fits and eight.nodes == 1 and eight.nodes_needed >= 2
    wanted = eight.nodes_needed * 8
    assert f"or {eight.nodes_needed} nodes: resources.train.processes: {wanted}" in eight.note
    spread = plan_job(shape, JobSpec("finetune", processes=wanted, **spec), "bfloat16", node)
    assert spread.fits and spread.nodes == eight.nodes_needed and spread.gpus == wanted
    assert spread.device_bytes <= 80 * GIB < eight.device_bytes
    fewer = plan_job(shape, JobSpec("finetune", processes=wanted - 8, **spec), "bfloat16", node)
    assert not fewer.fits or wanted == 16  # one node fewer does not fit (the fewest nodes)
    odd = plan_job(shape, JobSpec("finetune", processes=12, **spec), "bfloat16", node)
    assert not odd.fits and "12 processes on nodes of 8 GPUs" in odd.note and "a multiple of it" in odd.note
    assert nodes_of(16, 8) == 2 and nodes_of(8, 8) == 1 and nodes_of(4, 0) == 1
    with pytest.raises(ValueError, match="resources.gpus_per_node"):
        nodes_of(12, 8)


def test_8b_finetune_needs_sharding_and_picks_a_power_of_two_micro_batch():
    shape, node = KNOWN_SHAPES["meta-llama/Meta-Llama-3-8B"], Node(8, 80.0, 1000.0)
    one = plan_job(shape, JobSpec("finetune", "train", 32, 500, processes=1), "bfloat16", node)
    assert not one.fits and one.device_bytes > 16 * 8e9  # 16 B/param alone is 128 GB
    sharded = JobSpec("finetune", "train", 32, 500, processes=8, checkpointing=True, backend="fsdp")
    eight = plan_job(shape, sharded, "bfloat16", node)
    assert eight.fits and eight.device_bytes <= 80 * GIB
    assert eight.micro_batch in (1, 2, 4) and eight.micro_batch * eight.accumulation * 8 == 32
    bigger = plan_job(shape, sharded, "bfloat16", Node(8, 141.0, 1000.0))
    assert bigger.micro_batch >= eight.micro_batch
    replica = plan_job(shape, JobSpec("finetune", "train", 32, 500, processes=8, checkpointing=True), "bfloat16", node)
    assert not replica.fits and replica.device_bytes > 16 * 8e9 and "set finetune.backend: fsdp" in replica.note


def test_linalg_job_asks_for_no_gpu():
    plan = plan_job(
        KNOWN_SHAPES["meta-llama/Meta-Llama-3-70B"],
        JobSpec("erase_merged", "linalg"),
        "bfloat16",
        Node(8, 80.0, 1000.0),
    )
    assert plan.gpus == 0 and plan.device_bytes == 0 and plan.host_bytes < 12 * GIB


#: every shipped config: the default, the model presets (config/) and the test configs (tests/configs/)
CONFIGS = [
    shipped_config(str(p.relative_to(ROOT)), ROOT)
    for d in ("config", "tests/configs")
    for p in sorted((ROOT / d).glob("*.yaml"))
]


@pytest.mark.parametrize("name", ["config.yaml", *CONFIGS])
def test_qrerase_plan_prints_every_shipped_config(name, capsys):
    path = ROOT / name
    assert main(["plan", "--configfile", str(path)]) == 0
    out = capsys.readouterr().out
    assert "job" in out and "GiB" in out
    cfg = load_config(path)
    rows = plan_config(cfg)
    assert len(rows) >= 4 and all(r.name in out for r in rows)
    assert all(r.fits for r in rows), [r for r in rows if not r.fits]  # else `qrerase plan` exits 2


def test_rule_resources_from_the_plan_with_overrides(tmp_path):
    tiny = load_config(ROOT / "tests" / "configs" / "test.yaml")
    train = rule_resources(tiny, "train", threads=1)
    assert "gpu" not in train and "nodes" not in train and 1000 <= train["mem_mb"] <= 4000  # a laptop job
    big = load_config(ROOT / "config" / "llama3-70b.yaml")
    train = rule_resources(big, "train", threads=8)
    assert train["gpu"] == 8 and train["nodes"] == 1 and train["cpus_per_task"] == 64
    assert train["slurm_partition"] == "gpu"
    assert rule_resources(big, "evaluate", threads=8)["gpu"] == 4
    for kind in ("linalg", "light"):
        assert "gpu" not in rule_resources(big, kind, threads=8)
    big["resources"]["train"].update(mem_mb=123456, runtime=7, gpu=2)
    train = rule_resources(big, "train", threads=8)
    assert (train["mem_mb"], train["runtime"], train["gpu"]) == (123456, 7, 2)
    big["resources"]["train"]["processes"] = 0
    with pytest.raises(ValueError, match="resources.train.processes"):
        rule_resources(big, "train")


def test_plan_of_an_unknown_model_names_the_key(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {name_or_path: someone/unknown-7b, template: chat, device: auto}\ntracks: [tofu]\n")
    assert main(["plan", "--configfile", str(cfg)]) == 2
    assert "model.shape" in capsys.readouterr().err
    cfg.write_text(
        "model: {name_or_path: someone/unknown-7b, template: chat, device: auto, shape: {layers: 2, "
        "hidden: 64, intermediate: 128, vocab: 500, heads: 4, kv_heads: 2}}\ntracks: [tofu]\n"
    )
    assert main(["plan", "--configfile", str(cfg)]) == 0


def test_parameter_count_from_config_json_of_each_architecture():
    """The shape read from a config.json counts the parameters of the real model within 2 % (biases,
    Cohere's / Phi's norms and GPT-2's position embeddings are outside the shape)."""

    import transformers
    from support.architectures import CAUSAL

    for arch, (model_cls, config_cls, kwargs) in CAUSAL.items():
        config = getattr(transformers, config_cls)(**kwargs)
        real = sum(p.numel() for p in getattr(transformers, model_cls)(config).parameters())
        shape = shape_from_hf_config(config.to_dict(), arch)
        assert shape.count_params() == pytest.approx(real, rel=0.02), arch


def test_resource_kinds_are_the_config_resources_sections():
    """RESOURCE_CLASSES (the rules' resource classes, not the registry's runners) are each a
    ``resources.<class>`` section of the schema, and an unknown class is refused by name."""
    import yaml

    from qrerase.registry import RUNNERS

    sections = yaml.safe_load((ROOT / "schemas/config.schema.yaml").read_text(encoding="utf-8"))["properties"]
    assert RESOURCE_CLASSES == ("train", "evaluate", "linalg", "light")
    assert set(RESOURCE_CLASSES) <= set(sections["resources"]["properties"])
    assert not set(RESOURCE_CLASSES) & set(RUNNERS)  # two different sets, two names
    with pytest.raises(
        ValueError, match=r"resources_for: the resource class must be one of train, evaluate, linalg, light, got 'text'"
    ):
        rule_resources(load_config(ROOT / "config.yaml"), "text")
