# Config validation, path patterns, input functions and resource lookups shared by all rules.
import os
import sys
from pathlib import Path

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError

# The qrerase library of this checkout, also without an install.
sys.path.insert(0, workflow.basedir)
from qrerase.data import required_splits


# ---------------------------------------------------------------------------------------------
# Config validation: JSON schema first (one line naming the key), then cross-key checks.
# ---------------------------------------------------------------------------------------------
def validate_config(cfg):
    schema_path = Path(workflow.basedir) / "schemas" / "config.schema.yaml"
    schema = yaml.safe_load(schema_path.read_text())
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(cfg),
        key=lambda e: [str(p) for p in e.absolute_path],
    )
    if errors:
        err = errors[0]
        key = ".".join(str(p) for p in err.absolute_path) or "<top level>"
        raise WorkflowError(
            f"config key '{key}': {err.message} (see {schema_path.name})"
        )
    lora_r = cfg["lora"]["r"]
    for key in ("rank", "retain_rank"):
        value = cfg["unlearn"].get(key)
        if (
            value is not None
            and value > lora_r
            and not any(cfg["lora"]["adapters"].values())
        ):
            raise WorkflowError(
                f"config key 'unlearn.{key}': {value} exceeds the LoRA rank lora.r={lora_r}; "
                "the task matrices have rank at most r"
            )
    tiny = cfg["model"]["tiny"]
    if cfg["model"]["name_or_path"] is None:
        if tiny["hidden_size"] % tiny["num_attention_heads"]:
            raise WorkflowError(
                "config key 'model.tiny.hidden_size': must be divisible by num_attention_heads"
            )
        if tiny["num_attention_heads"] % tiny["num_key_value_heads"]:
            raise WorkflowError(
                "config key 'model.tiny.num_key_value_heads': must divide num_attention_heads"
            )
    data = cfg["tofu"]["data"]
    if data["source"] == "local":
        root = Path(data["root"])
        for name in required_splits(data["split"], data.get("knowledge", [])):
            if not (root / f"{name}.jsonl").is_file():
                raise WorkflowError(
                    f"config key 'tofu.data.root': data file {root / f'{name}.jsonl'} not found"
                )
    for set_name, path in cfg["lora"]["adapters"].items():
        if path is not None and not (Path(path) / "adapter_config.json").is_file():
            raise WorkflowError(
                f"config key 'lora.adapters.{set_name}': {path} holds no adapter_config.json"
            )
    for item in cfg["tofu"].get("imported_models", []):
        for key in ("log", "reference"):
            if item.get(key) and not Path(item[key]).exists():
                raise WorkflowError(
                    f"config key 'tofu.imported_models[{item['name']}].{key}': {item[key]} not found"
                )


validate_config(config)

# Jobs import the qrerase library of this checkout, in any software environment (plain venv, conda
# envs from envs/, or a cluster node): the workflow and its library never drift apart.
os.environ.update(
    PYTHONPATH=os.pathsep.join(
        p for p in (workflow.basedir, os.environ.get("PYTHONPATH", "")) if p
    )
)

# ---------------------------------------------------------------------------------------------
# Names and path patterns: every artifact path of the workflow is defined here, once.
# ---------------------------------------------------------------------------------------------
EXP = f"tofu_{config['tofu']['data']['split']}"
RANK = config["unlearn"]["rank"]
METHODS = list(config["methods"]["tofu"])
DECOMP = {
    "unlearn": "svd",
    "unlearn_ll": "svd",
    "qr_erase": "cpqr",
    "qr_erase_ll": "cpqr",
}
DATA_SETS = [
    "forget",
    "retain",
    "knowledge",
    "finetune_full",
    "finetune_retain",
    "eval_forget",
    "eval_retain",
    "eval_real_authors",
    "eval_world_facts",
]
EVAL_SETS = ["forget", "retain", "real_authors", "world_facts"]

PATHS = {
    "data": "results/{exp}/data/{name}.jsonl",
    "tokenizer": "results/{exp}/models/tokenizer",
    "model": "results/{exp}/models/{which}",
    "train_curve": "results/{exp}/models/{which}_loss.csv",
    "lora": "results/{exp}/lora/{set}",
    "lora_curve": "results/{exp}/lora/{set}_loss.csv",
    "task_matrix": "results/{exp}/task_matrices/{set}.safetensors",
    "factors": "results/{exp}/factors/k{rank}/{decomp}_{set}.safetensors",
    "factor_report": "results/{exp}/factors/k{rank}/report.csv",
    "energy": "results/{exp}/energy/energy.csv",
    "selected": "results/{exp}/energy/selected_layers.json",
    "energy_fig": "results/figures/{exp}_energy.png",
    "update": "results/{exp}/updates/k{rank}/{decomp}.safetensors",
    "erase_adapter": "results/{exp}/erase/k{rank}/{method}/adapter",
    "erased_model": "results/{exp}/erase/k{rank}/{method}/model",
    "eval": "results/{exp}/eval/{model}",
    "metrics": "results/{exp}/metrics/{model}.csv",
    "table": "results/tables/{table}.{ext}",
    "figure": "results/figures/{name}.png",
    "log": "results/logs/{rule}/{name}.log",
}


def path(key, **wildcards):
    """Fill a path pattern; unfilled wildcards stay as {name} for rule declarations."""
    return PATHS[key].format_map(_Keep(wildcards))


class _Keep(dict):
    def __missing__(self, key):
        return f"{{{key}}}"


def log_path(rule_name, *wildcard_names):
    name = "_".join(f"{{{w}}}" for w in wildcard_names) or rule_name
    return PATHS["log"].format(rule=rule_name, name=name)


wildcard_constraints:
    exp=r"tofu_forget\d\d|xling|xling_[a-z]{2}(_R)?|speech|speech_(sample|class)",
    name=r"[a-z_]+",
    which="full|retain",
    set="forget|retain",
    rank=r"\d+",
    decomp="cpqr|svd",
    method="|".join(DECOMP),
    model=r"[A-Za-z0-9_.-]+",


# ---------------------------------------------------------------------------------------------
# Config lookups.
# ---------------------------------------------------------------------------------------------
def tiny_model():
    return config["model"]["name_or_path"] is None


def model_exp(exp):
    """The experiment whose fine-tuned models an experiment unlearns from.

    TOFU experiments own their models; 'xling_<lang>' unlearns from the multilingual 'xling' models
    and 'speech_<setting>' from the 'speech' model.
    """
    track, _, _ = exp.partition("_")
    return track if track in ("xling", "speech") else exp


def base_model(wildcards):
    """The fine-tuned ("full") model an experiment's LoRA adapters and erase edits start from."""
    return path("model", exp=model_exp(wildcards.exp), which="full")


def eval_models():
    """Model names evaluated in the TOFU table: base, retain reference, each method at rank k."""
    return ["base", "retain"] + [f"{m}_k{RANK}" for m in METHODS]


def split_model(model):
    """'qr_erase_k4' -> ('qr_erase', '4'); any other model name -> (name, None)."""
    method, _, rank = model.rpartition("_k")
    return (method, rank) if method in DECOMP and rank.isdigit() else (model, None)


def row_key(model):
    """The table's row key of a model: its method (rank dropped), base, retain or imported name."""
    return split_model(model)[0]


def resources_for(kind):
    res = dict(config["resources"][kind])
    out = {"mem_mb": res["mem_mb"], "runtime": res["runtime"]}
    if res.get("gpu"):
        out["gpu"] = res["gpu"]
    if res.get("slurm_extra"):
        out["slurm_extra"] = res["slurm_extra"]
    return out


# ---------------------------------------------------------------------------------------------
# Input functions.
# ---------------------------------------------------------------------------------------------
def tofu_data_files(wildcards):
    """The vendored files the data rule reads (so editing one re-runs everything downstream)."""
    data = config["tofu"]["data"]
    if data["source"] != "local":
        return []
    names = required_splits(data["split"], data.get("knowledge", []))
    return [str(Path(data["root"]) / f"{n}.jsonl") for n in names]


def base_model_inputs(wildcards):
    """The tokenizer built here (embedded default) or nothing (a hub/local model)."""
    return {"tokenizer": path("tokenizer", exp=wildcards.exp)} if tiny_model() else {}


def adapter_dir(wildcards):
    """A user's existing adapter for this set, or the one the lora rule trains."""
    given = config["lora"]["adapters"].get(wildcards.set)
    return given if given else path("lora", exp=wildcards.exp, set=wildcards.set)


def erase_inputs(wildcards):
    decomp = DECOMP[wildcards.method]
    inputs = {
        "tilde": path("update", exp=wildcards.exp, rank=wildcards.rank, decomp=decomp)
    }
    if wildcards.method.endswith("_ll"):
        inputs["selected"] = path("selected", exp=wildcards.exp)
    return inputs


def eval_model_inputs(wildcards):
    """Where the evaluated model's weights come from: a checkpoint, or base + erase adapter."""
    model = wildcards.model
    if model in ("base", "retain"):
        which = "full" if model == "base" else "retain"
        return {"model": path("model", exp=wildcards.exp, which=which)}
    method, rank = split_model(model)
    if rank is None:
        raise WorkflowError(f"evaluate: unknown model '{model}'")
    if "merged" in config["erase"]["outputs"]:
        return {
            "model": path("erased_model", exp=wildcards.exp, rank=rank, method=method)
        }
    return {
        "model": path("model", exp=wildcards.exp, which="full"),
        "adapter": path("erase_adapter", exp=wildcards.exp, rank=rank, method=method),
    }


def eval_data_inputs(wildcards):
    return {s: path("data", exp=wildcards.exp, name=f"eval_{s}") for s in EVAL_SETS}


def imported_models():
    return {m["name"]: m for m in config["tofu"].get("imported_models", [])}


def metrics_inputs(wildcards):
    """A model's eval log and the retain reference's (none for the reference itself)."""
    local_ref = path("eval", exp=wildcards.exp, model="retain")
    item = imported_models().get(wildcards.model)
    if item is not None:
        return {"log": item["log"], "reference": item.get("reference") or local_ref}
    inputs = {"log": path("eval", exp=wildcards.exp, model=wildcards.model)}
    if wildcards.model != "retain":
        inputs["reference"] = local_ref
    return inputs


def metrics_name(wildcards):
    return row_key(wildcards.model)


def erase_targets():
    outs = []
    for method in METHODS:
        if "adapter" in config["erase"]["outputs"]:
            outs.append(path("erase_adapter", exp=EXP, rank=RANK, method=method))
        if "merged" in config["erase"]["outputs"]:
            outs.append(path("erased_model", exp=EXP, rank=RANK, method=method))
    return outs


def tofu_targets():
    return [
        *expand(PATHS["table"], table="tofu", ext=["csv", "md", "tex"]),
        *expand(PATHS["table"], table="tofu_wide", ext=["csv", "md", "tex"]),
        path("figure", name="tofu_truth_ratio"),
        path("energy_fig", exp=EXP),
        path("factor_report", exp=EXP, rank=RANK),
        *erase_targets(),
    ]


# ---------------------------------------------------------------------------------------------
# The default target: every configured track; each track's section registers its targets below.
# ---------------------------------------------------------------------------------------------
TRACK_TARGETS = {"tofu": tofu_targets}


def all_targets():
    return [t for track in config["tracks"] for t in TRACK_TARGETS[track]()]


# ---------------------------------------------------------------------------------------------
# Cross-lingual track.
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Speech track.
# ---------------------------------------------------------------------------------------------
from qrerase.speech_baselines import SPEECH_BASELINES


def validate_speech_config(cfg):
    """Cross-key checks of the `speech` section (the schema has checked types and ranges)."""
    from qrerase.speech import list_recordings

    sp = cfg["speech"]
    for key in ("forget_fraction", "test_fraction"):
        if not 0.0 < float(sp[key]) < 1.0:
            raise WorkflowError(
                f"config key 'speech.{key}': must lie in (0, 1), got {sp[key]}"
            )
    lora_r = sp["lora"]["r"]
    for k in [sp["rank"], *sp["ranks"]]:
        if k > lora_r:
            raise WorkflowError(
                f"config key 'speech.rank(s)': rank {k} exceeds the LoRA rank speech.lora.r={lora_r}; "
                "the task matrices have rank at most r"
            )
    if not set(sp["rank_settings"]) <= set(sp["settings"]):
        raise WorkflowError(
            f"config key 'speech.rank_settings': {sp['rank_settings']} must be among speech.settings {sp['settings']}"
        )
    if "speech" not in cfg["tracks"]:
        return  # the data checks below need the recordings; a run without the track needs neither
    root = sp["data"]["root"]
    try:
        recs = list_recordings(root, sp["data"].get("max_per_digit"))
    except (FileNotFoundError, ValueError) as exc:
        raise WorkflowError(f"config key 'speech.data.root': {exc}") from None
    speakers = sorted({r.speaker for r in recs})
    for name in sp.get("forget_speakers") or []:
        if name not in speakers:
            raise WorkflowError(
                f"config key 'speech.forget_speakers': speaker '{name}' not in {root} (speakers: {', '.join(speakers)})"
            )
    if sp.get("forget_speakers") is not None and len(set(sp["forget_speakers"])) >= len(
        speakers
    ):
        raise WorkflowError(
            "config key 'speech.forget_speakers': at least one speaker must be retained"
        )
    if sp["top_k"] > len(speakers):
        raise WorkflowError(
            f"config key 'speech.top_k': {sp['top_k']} exceeds the number of speakers ({len(speakers)})"
        )


validate_speech_config(config)

SPEECH_SETTINGS = list(config["speech"]["settings"])
SPEECH_RANK_SETTINGS = list(config["speech"]["rank_settings"])
SPEECH_RANK = config["speech"]["rank"]
SPEECH_RANKS = sorted(set(config["speech"]["ranks"]))
SPEECH_METHODS = list(config["methods"].get("speech", []))

PATHS.update(
    {
        "speech_audio": "results/{exp}/data/audio.safetensors",
        "speech_index": "results/{exp}/data/index.csv",
        "speech_meta": "results/{exp}/data/meta.json",
        "speech_eval": "results/{exp}/speech_eval/{model}.csv",
        "speech_baseline": "results/{exp}/baselines/{method}/model",
        "speech_baseline_curve": "results/{exp}/baselines/{method}/loss.csv",
    }
)


def speech_bench(rule_name, *wildcard_names):
    """Snakemake `benchmark:` file of a training rule (wall time, memory), for cost tables."""
    name = "_".join(f"{{{w}}}" for w in wildcard_names) or rule_name
    return f"results/benchmarks/{rule_name}/{name}.tsv"


def model_kind(exp):
    """Which model class an experiment's checkpoints hold: 'audio_classifier' (speech) or 'causal_lm'."""
    return "audio_classifier" if exp.partition("_")[0] == "speech" else "causal_lm"


def erase_scale(exp):
    """lambda of W' = W - lambda T~_f for an experiment: `speech.scale` for speech, else `unlearn.scale`."""
    if exp.partition("_")[0] == "speech":
        return config["speech"]["scale"]
    return config["unlearn"]["scale"]


def speech_setting(wildcards):
    """'speech_sample' -> 'sample'."""
    return wildcards.exp.partition("_")[2]


def speech_data_params():
    sp = config["speech"]
    return {
        **sp["data"],
        "test_fraction": sp["test_fraction"],
        "forget_fraction": sp["forget_fraction"],
        "forget_speakers": sp.get("forget_speakers"),
    }


def speech_wavs(wildcards):
    """The recordings the data rule reads (editing one re-runs everything downstream)."""
    from qrerase.speech import list_recordings

    data = config["speech"]["data"]
    try:
        recs = list_recordings(data["root"], data.get("max_per_digit"))
    except (FileNotFoundError, ValueError) as exc:
        raise WorkflowError(f"config key 'speech.data.root': {exc}") from None
    return [r.path for r in recs]


def speech_data_inputs():
    """The prepared arrays, index and metadata (always those of exp 'speech')."""
    return {
        key: path(f"speech_{key}", exp="speech") for key in ("audio", "index", "meta")
    }


def speech_baseline_params(wildcards):
    """`speech.baselines.common` overlaid by `speech.baselines.<method>`."""
    b = config["speech"]["baselines"]
    return {**b.get("common", {}), **b.get(wildcards.method, {})}


def speech_models():
    """Model names evaluated in the speech table: base, then each method (subspace ones at rank k)."""
    return ["base"] + [
        f"{m}_k{SPEECH_RANK}" if m in DECOMP else m for m in SPEECH_METHODS
    ]


def speech_checkpoint(wildcards):
    """Model name -> checkpoint: base, '<method>_k<rank>' (merged erase) or a baseline."""
    model = wildcards.model
    if model == "base":
        return base_model(wildcards)
    if model in SPEECH_BASELINES:
        return path("speech_baseline", exp=wildcards.exp, method=model)
    method, rank = split_model(model)
    if rank is None:
        raise WorkflowError(f"speech_evaluate: unknown model '{model}'")
    return path("erased_model", exp=wildcards.exp, rank=rank, method=method)


def speech_targets():
    outs = [
        *expand(PATHS["table"], table="speech", ext=["csv", "md", "tex"]),
        path("figure", name="speech_energy"),
        *expand(PATHS["table"], table="speech_energy", ext=["csv", "md"]),
        *[path("energy_fig", exp=f"speech_{s}") for s in SPEECH_SETTINGS],
    ]
    if SPEECH_RANK_SETTINGS:
        outs += [
            path("figure", name="speech_rank"),
            path("table", table="speech_rank", ext="csv"),
        ]
    return outs


TRACK_TARGETS["speech"] = speech_targets

# ---------------------------------------------------------------------------------------------
# Optimisation baselines.
# ---------------------------------------------------------------------------------------------
