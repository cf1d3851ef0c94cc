# Config validation, path patterns, input functions and resource lookups shared by all rules.
import os
import sys
from pathlib import Path

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError

# The qrerase library of this checkout, also without an install.
sys.path.insert(0, workflow.basedir)
from qrerase.text.data import required_splits


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
# The control of the selectivity diagnostic: '<method>_control' is the same edit built with the roles
# of the two adapters swapped (T_f := T_r, P_r from T_f), on the same layers (unlearn.control).
CONTROL = "_control"
CONTROLS = [f"{m}{CONTROL}" for m in config["unlearn"].get("control", [])]


def method_decomp(method):
    """'qr_erase_ll' or 'qr_erase_ll_control' -> 'cpqr'."""
    return DECOMP[method.removesuffix(CONTROL)]


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
    "pretrain",
    "tune_retain",
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
    "update_control": "results/{exp}/updates/k{rank}/{decomp}_control.safetensors",
    "erase_adapter": "results/{exp}/erase/k{rank}/{method}/adapter",
    "erased_model": "results/{exp}/erase/k{rank}/{method}/model",
    "eval": "results/{exp}/eval/{model}",
    "metrics": "results/{exp}/metrics/{model}.csv",
    "table": "results/tables/{table}.{ext}",
    "figure": "results/figures/{name}.png",
    "log": "results/logs/{rule}/{name}.log",
    "manifest": "results/provenance/manifest.json",
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
    exp=r"tofu_forget\d\d|xling|xling_[a-z]{2}(_R)?|speech|speech_(sample|class)|task",
    name=r"[a-z_]+",
    which="full|retain|pretrained",
    set="forget|retain",
    rank=r"\d+",
    decomp="cpqr|svd",
    method="|".join([*DECOMP, *(f"{m}{CONTROL}" for m in DECOMP)]),
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
    """The fine-tuned ("full") model an experiment's erase edits (and baselines) start from."""
    return path("model", exp=model_exp(wildcards.exp), which="full")


def lora_base_inputs(wildcards):
    """The checkpoint the task adapters train from (`lora.base`): the fine-tuned model, or the
    pretrained one (the checkpoint built by rule pretrain; for a hub model, the hub checkpoint
    itself, which is no workflow file and is passed as a param instead)."""
    if config["lora"].get("base", "finetuned") == "finetuned":
        return {"model": base_model(wildcards)}
    if tiny_model():
        return {
            "model": path("model", exp=model_exp(wildcards.exp), which="pretrained")
        }
    return {}


def tokenizer_texts(wildcards):
    """The text the embedded model's tokenizer is trained on: the fine-tuning set, every evaluation
    set and the pretraining text (the task-level track has no pretraining set yet)."""
    names = [
        "finetune_full",
        "eval_forget",
        "eval_retain",
        "eval_real_authors",
        "eval_world_facts",
    ]
    if wildcards.exp != "task":
        names.append("pretrain")
    return [path("data", exp=wildcards.exp, name=n) for n in names]


def finetune_init_inputs(wildcards):
    """What fine-tuning starts from: the tokenizer to build the model on (rule pretrain), the
    pretrained checkpoint (both fine-tuned models of the embedded default), or nothing (a hub
    model, loaded by name)."""
    if not tiny_model():
        return {}
    if wildcards.exp == "task":  # the task-level track (rules/task_common.smk)
        return task_start_inputs(wildcards)
    if wildcards.get("which", "pretrained") == "pretrained":
        return {"tokenizer": path("tokenizer", exp=wildcards.exp)}
    return {"init": path("model", exp=wildcards.exp, which="pretrained")}


def eval_models():
    """Model names evaluated in the TOFU table: base, retain reference, each method (subspace
    methods at rank k: '<method>_k<rank>'; optimisation baselines by their name, e.g. 'npo').
    """
    return (
        ["base", "retain"]
        + [m if m in BASELINES else f"{m}_k{RANK}" for m in METHODS]
        + [f"{m}_k{RANK}" for m in CONTROLS]
    )


def split_model(model):
    """'qr_erase_k4' -> ('qr_erase', '4'); any other model name -> (name, None)."""
    method, _, rank = model.rpartition("_k")
    known = method.removesuffix(CONTROL) in DECOMP
    return (method, rank) if known and rank.isdigit() else (model, None)


def row_key(model):
    """The table's row key of a model: its method (rank dropped), base, retain or imported name."""
    return split_model(model)[0]


def model_size_b():
    """Parameter count of the model in billions (config model.size_b); 0 for the embedded tiny model."""
    return config["model"].get("size_b") or 0


def resources_for(kind):
    """Snakemake resources of a rule kind (train/evaluate/linalg/light), scaled by the model size.

    mem_mb = mem_mb + mem_mb_per_b * size_b and runtime = runtime + runtime_per_b * size_b (minutes);
    gpu (the slurm plugin's --gpus), slurm_partition and slurm_extra are passed on when set.
    """
    res = config["resources"][kind]
    size = model_size_b()
    out = {
        "mem_mb": int(round(res["mem_mb"] + res.get("mem_mb_per_b", 0) * size)),
        "runtime": int(round(res["runtime"] + res.get("runtime_per_b", 0) * size)),
    }
    for key in ("gpu", "slurm_partition", "slurm_extra"):
        if res.get(key):
            out[key] = res[key]
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


def adapter_dir(wildcards):
    """A user's existing adapter for this set, or the one the lora rule trains."""
    given = config["lora"]["adapters"].get(wildcards.set)
    return given if given else path("lora", exp=wildcards.exp, set=wildcards.set)


def retain_factors(wildcards, which):
    """The factors P_r is built from (eq. 3): rank max(k, unlearn.retain_rank), so that a retain rank
    above k uses the leading columns of a decomposition that has them (truncation is exact).
    """
    rank = max(int(wildcards.rank), config["unlearn"].get("retain_rank") or 0)
    return path(
        "factors", exp=wildcards.exp, rank=rank, decomp=wildcards.decomp, set=which
    )


def forget_adapter_dir(wildcards):
    """The experiment's forget adapter (its fan_in_fan_out, set for Conv1D models, carries over)."""
    given = config["lora"]["adapters"].get("forget")
    return given if given else path("lora", exp=wildcards.exp, set="forget")


def erase_inputs(wildcards):
    key = "update_control" if wildcards.method.endswith(CONTROL) else "update"
    decomp = method_decomp(wildcards.method)
    inputs = {"tilde": path(key, exp=wildcards.exp, rank=wildcards.rank, decomp=decomp)}
    if wildcards.method.removesuffix(CONTROL).endswith("_ll"):
        inputs["selected"] = path("selected", exp=wildcards.exp)
    return inputs


def eval_model_inputs(wildcards):
    """Where the evaluated model's weights come from: a checkpoint (base, retain, a baseline's, a
    merged erase), or base + erase adapter."""
    model = wildcards.model
    if model in ("base", "retain"):
        which = "full" if model == "base" else "retain"
        return {"model": path("model", exp=model_exp(wildcards.exp), which=which)}
    if model in BASELINES:
        return {"model": path("baseline_model", exp=wildcards.exp, method=model)}
    method, rank = split_model(model)
    if rank is None:
        raise WorkflowError(f"evaluate: unknown model '{model}'")
    if "merged" in config["erase"]["outputs"]:
        return {
            "model": path("erased_model", exp=wildcards.exp, rank=rank, method=method)
        }
    return {
        "model": base_model(wildcards),
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
    for method in [m for m in METHODS if m in DECOMP]:
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
# Unlearn in language X (exp "xling_X": LoRA on forget_X / retain_X, then the generic subspace chain
# on the shared multilingual models of exp "xling"), evaluate in every configured language Y.
from qrerase.text.crosslingual import SPLIT_FILES as XLING_SPLITS
from qrerase.text.crosslingual import check_language_files, parse_language

XLING_SETS = [
    "forget",
    "retain",
    "knowledge",
    "pretrain",
    "eval_forget",
    "eval_retain",
    "eval_real_authors",
    "eval_world_facts",
]
XLING_SHARED_DATA = [
    "finetune_full",
    "finetune_retain",
    "pretrain",
    "eval_forget",
    "eval_retain",
    "eval_real_authors",
    "eval_world_facts",
]
PATHS.update(
    {
        "xling_romanised": "results/xling/romanised/{lang}/{split}.jsonl",
        "xling_sets": "results/xling/languages/{lang}/{name}.jsonl",
        "xling_eval": "results/{exp}/eval_languages/{model}",
        "xling_metrics": "results/xling/metrics.csv",
        "xling_energy": "results/xling/energy.csv",
    }
)


def validate_crosslingual_config(cfg):
    """Cross-checks of the 'crosslingual' section (after the schema); data files only when the track runs."""
    xl = cfg.get("crosslingual")
    runs = "crosslingual" in cfg["tracks"]
    if xl is None or "crosslingual" not in cfg["methods"]:
        if runs:
            raise WorkflowError(
                "config key 'crosslingual': the crosslingual track needs a 'crosslingual' section "
                "and 'methods.crosslingual'"
            )
        return
    for key in ("languages", "unlearn"):
        for i, code in enumerate(xl[key]):
            try:
                parse_language(code)
            except ValueError as exc:
                raise WorkflowError(
                    f"config key 'crosslingual.{key}[{i}]': {exc}"
                ) from None
    for i, code in enumerate(xl["unlearn"]):
        if code not in xl["languages"]:
            raise WorkflowError(
                f"config key 'crosslingual.unlearn[{i}]': '{code}' is not in crosslingual.languages {xl['languages']}"
            )
    if xl["table_method"] not in cfg["methods"]["crosslingual"]:
        raise WorkflowError(
            f"config key 'crosslingual.table_method': '{xl['table_method']}' is not in "
            f"methods.crosslingual {cfg['methods']['crosslingual']}"
        )
    if not runs:
        return
    for code in dict.fromkeys(parse_language(c)[0] for c in xl["languages"]):
        try:
            check_language_files(xling_vendored_root(code, cfg))
        except (ValueError, FileNotFoundError) as exc:
            root = "english_root" if code == "en" else "root"
            raise WorkflowError(
                f"config key 'crosslingual.data.{root}': {exc}"
            ) from None


def xling_vendored_root(code, cfg=None):
    """The folder of a (non-romanised) language's six TOFU splits: TOFU itself for English."""
    data = (cfg or config)["crosslingual"]["data"]
    return data["english_root"] if code == "en" else str(Path(data["root"]) / code)


def xling_root(code):
    """A language's split folder: vendored, or (for '<lang>_R') the romanised copy built here."""
    base, script = parse_language(code)
    if script is None:
        return xling_vendored_root(base)
    return str(Path(path("xling_romanised", lang=code, split="x")).parent)


validate_crosslingual_config(config)

XLING = config.get("crosslingual", {})
XLING_LANGS = list(XLING.get("languages", []))
XLING_UNLEARN = list(XLING.get("unlearn", []))
XLING_METHODS = list(config["methods"].get("crosslingual", []))


def exp_section(section, exp):
    """A training config section for an experiment: 'finetune', 'lora' or 'tokenizer' (model.tokenizer),
    with the cross-lingual track's overrides (crosslingual.<section>) for its experiments.
    """
    base = dict(
        config["model"]["tokenizer"] if section == "tokenizer" else config[section]
    )
    if model_exp(exp) == "xling":
        base.update(XLING.get(section) or {})
    if exp == "task":  # the task-level track's overrides (task.<section>)
        base.update(config.get("task", {}).get(section) or {})
    return base


def xling_exp(code):
    """The experiment that unlearns in language ``code``: 'xling_hi_R'."""
    return f"xling_{code}"


def xling_models():
    """(exp, model name) of every evaluated model: base and reference, then each method per language."""
    models = [("xling", "base"), ("xling", "retain")]
    for code in XLING_UNLEARN:
        models += [
            (xling_exp(code), m if m in BASELINES else f"{m}_k{RANK}")
            for m in XLING_METHODS
        ]
    return models


def xling_model_inputs(wildcards):
    """Model name -> checkpoint: the shared base/reference models, or an exp's erased model.

    The one place that maps a cross-lingual model name to its weights: 'base', 'retain', a subspace
    method's '<method>_k<rank>' or an optimisation baseline's name (trained in exp xling_X).
    """
    if wildcards.model in ("base", "retain"):
        which = "full" if wildcards.model == "base" else "retain"
        return {"model": path("model", exp="xling", which=which)}
    if not wildcards.exp.startswith("xling_"):
        raise WorkflowError(
            f"xling_evaluate: model '{wildcards.model}' belongs to an 'xling_<lang>' experiment"
        )
    return eval_model_inputs(wildcards)


def xling_split_files(wildcards):
    """The six split files a language's sets are cut from (tracked, so an edit re-runs them)."""
    root = xling_root(wildcards.lang)
    return [str(Path(root) / f"{s}.jsonl") for s in XLING_SPLITS]


def xling_eval_sets(wildcards):
    return {
        f"{lang}:{s}": path("xling_sets", lang=lang, name=f"eval_{s}")
        for lang in XLING_LANGS
        for s in EVAL_SETS
    }


def crosslingual_targets():
    return [
        *expand(
            PATHS["table"],
            table=["crosslingual", "crosslingual_matrix"],
            ext=["csv", "md", "tex"],
        ),
        path("figure", name="crosslingual_scatter"),
        path("figure", name="crosslingual_energy"),
        path("xling_metrics"),
        path("xling_energy"),
        *[path("energy_fig", exp=xling_exp(c)) for c in XLING_UNLEARN],
    ]


TRACK_TARGETS["crosslingual"] = crosslingual_targets


# ---------------------------------------------------------------------------------------------
# Speech track.
# ---------------------------------------------------------------------------------------------
from qrerase.speech.baselines import SPEECH_BASELINES


def validate_speech_config(cfg):
    """Cross-key checks of the `speech` section (the schema has checked types and ranges)."""
    from qrerase.speech.data import list_recordings

    sp = cfg["speech"]
    for key in ("forget_fraction", "test_fraction"):
        if not 0.0 < float(sp[key]) < 1.0:
            raise WorkflowError(
                f"config key 'speech.{key}': must lie in (0, 1), got {sp[key]}"
            )
    lora_r = sp["lora"]["r"]
    for k in [sp["rank"], *sp["ranks"], *sp["tradeoff"]["ranks"]]:
        if k > lora_r:
            raise WorkflowError(
                f"config key 'speech.rank(s)': rank {k} exceeds the LoRA rank speech.lora.r={lora_r}; "
                "the task matrices have rank at most r"
            )
    if not set(sp["rank_settings"]) <= set(sp["settings"]):
        raise WorkflowError(
            f"config key 'speech.rank_settings': {sp['rank_settings']} must be among speech.settings {sp['settings']}"
        )
    if not set(sp["tradeoff"]["settings"]) & set(sp["settings"]):
        raise WorkflowError(
            f"config key 'speech.tradeoff.settings': {sp['tradeoff']['settings']} shares no setting with speech.settings {sp['settings']}"
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
        "speech_pretrained": "results/{exp}/models/pretrained",
        "speech_pretrain_curve": "results/{exp}/models/pretrained_loss.csv",
        "speech_tradeoff_points": "results/{exp}/tradeoff/{method}.csv",
    }
)


def model_kind(exp):
    """Which model class an experiment's checkpoints hold: 'audio_classifier' (speech) or 'causal_lm'."""
    return "audio_classifier" if exp.partition("_")[0] == "speech" else "causal_lm"


def erase_scale(exp):
    """lambda of W' = W - lambda T~_f for an experiment: `speech.scale` for speech, else `unlearn.scale`."""
    if exp.partition("_")[0] == "speech":
        return config["speech"]["scale"]
    if exp == "task":
        return config["task"].get("scale", config["unlearn"]["scale"])
    return config["unlearn"]["scale"]


def speech_setting(wildcards):
    """'speech_sample' -> 'sample'."""
    return wildcards.exp.partition("_")[2]


def speech_data_params():
    sp = config["speech"]
    return {
        **sp["data"],
        "test_fraction": sp["test_fraction"],
        "val_fraction": sp.get("val_fraction", 0.0),
        "forget_fraction": sp["forget_fraction"],
        "forget_speakers": sp.get("forget_speakers"),
    }


def speech_wavs(wildcards):
    """The recordings the data rule reads (editing one re-runs everything downstream)."""
    from qrerase.speech.data import list_recordings

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


def speech_tiny():
    """True for the embedded tiny HuBERT (pretrained here); False for a hub checkpoint (the pretrained model)."""
    return config["speech"]["model"]["name_or_path"] is None


def speech_pretrained_inputs(wildcards=None):
    """The digit-pretrained checkpoint fine-tuning starts from (none for a hub model: the hub checkpoint)."""
    return (
        {"pretrained": path("speech_pretrained", exp="speech")} if speech_tiny() else {}
    )


def speech_lora_inputs(wildcards):
    """The fine-tuned model and, for speech.lora.base 'pretrained', the encoder the adapters train on."""
    inputs = {"model": base_model(wildcards)}
    if config["speech"]["lora"].get("base", "finetuned") == "pretrained":
        inputs.update(speech_pretrained_inputs(wildcards))
    return inputs


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

SPEECH_TRADEOFF = config["speech"]["tradeoff"]
# the sweep runs on the settings the track runs (speech.settings) that speech.tradeoff.settings names
SPEECH_TRADEOFF_SETTINGS = [
    s for s in SPEECH_TRADEOFF["settings"] if s in SPEECH_SETTINGS
]


def speech_tradeoff_methods():
    """Methods of the trade-off sweep: the subspace ones of methods.speech, then its baselines that
    have a knob under speech.tradeoff.baselines."""
    sweeps = SPEECH_TRADEOFF["baselines"]
    return [m for m in SPEECH_METHODS if m in DECOMP] + [
        m for m in SPEECH_METHODS if m in SPEECH_BASELINES and m in sweeps
    ]


def speech_tradeoff_factor_inputs(wildcards):
    """The lambda-free factors of both sets at every swept rank (and the LL selection)."""
    inputs = {
        f"{s}_k{k}": path(
            "factors",
            exp=wildcards.exp,
            rank=k,
            decomp=DECOMP[wildcards.method],
            set=s,
        )
        for k in sorted(SPEECH_TRADEOFF["ranks"])
        for s in ("forget", "retain")
    }
    if wildcards.method.endswith("_ll"):
        inputs["selected"] = path("selected", exp=wildcards.exp)
    return inputs


def speech_tradeoff_targets():
    """The speech trade-off sweep's outputs (not part of the default target; `snakemake speech_tradeoff_all`)."""
    return [
        path("table", table="speech_tradeoff", ext="csv"),
        path("table", table="speech_scale_rule", ext="csv"),
        path("figure", name="speech_tradeoff"),
    ]


def speech_tradeoff_baseline_inputs(wildcards):
    """A baseline's workflow-trained model (re-used at its configured knob value); none for 'base'."""
    if wildcards.method == "base":
        return {}
    return {
        "trained": path("speech_baseline", exp=wildcards.exp, method=wildcards.method)
    }


def speech_tradeoff_sweep(wildcards):
    """(knob, values) of a baseline's sweep; ('', []) for the fine-tuned reference point."""
    if wildcards.method == "base":
        return {"param": "", "values": []}
    sweep = SPEECH_TRADEOFF["baselines"][wildcards.method]
    return {"param": sweep["param"], "values": list(sweep["values"])}


# ---------------------------------------------------------------------------------------------
# Optimisation baselines.
# ---------------------------------------------------------------------------------------------
# Baseline methods = the schema's methods.tofu enum minus the subspace methods (kept torch-free;
# tests check it equals qrerase.baselines.text.TEXT_BASELINES).
BASELINES = [
    m
    for m in yaml.safe_load(
        (Path(workflow.basedir) / "schemas" / "config.schema.yaml").read_text()
    )["properties"]["methods"]["properties"]["tofu"]["items"]["enum"]
    if m not in DECOMP
]
TOFU_BASELINES = [m for m in METHODS if m in BASELINES]

PATHS.update(
    {
        "baseline_model": "results/{exp}/baselines/{method}/model",
        "baseline_curve": "results/{exp}/baselines/{method}_loss.csv",
        "benchmark": "results/benchmarks/{rule}/{name}.tsv",
    }
)


def benchmark_path(rule_name, *wildcard_names):
    """Snakemake benchmark file (wall time, RSS) of a rule's job: results/benchmarks/<rule>/<wcs>.tsv."""
    name = "_".join(f"{{{w}}}" for w in wildcard_names) or rule_name
    return PATHS["benchmark"].format(rule=rule_name, name=name)


# Tracks whose `methods` may list the text baselines.
TEXT_BASELINE_TRACKS = ["tofu", "crosslingual"]


def validate_baselines_config(cfg):
    """Every text baseline listed in a text track's methods has its `baselines.<method>` settings."""
    for track in TEXT_BASELINE_TRACKS:
        for i, method in enumerate(cfg["methods"].get(track, [])):
            if method in BASELINES and not cfg.get("baselines", {}).get(method):
                raise WorkflowError(
                    f"config key 'methods.{track}.{i}': baseline '{method}' has no "
                    f"'baselines.{method}' settings (epochs, lr, batch_size, ...)"
                )
    refusals = cfg.get("baselines", {}).get("refusals")
    if refusals is not None and not Path(refusals).is_file():
        raise WorkflowError(f"config key 'baselines.refusals': {refusals} not found")


validate_baselines_config(config)


def refusals_file():
    """DPO / FLAT template answers: baselines.refusals, else idontknow.txt next to the TOFU data."""
    given = config["baselines"].get("refusals")
    return (
        given if given else str(Path(config["tofu"]["data"]["root"]) / "idontknow.txt")
    )


def baseline_inputs(wildcards):
    """The fine-tuned model of the experiment's model family, its forget/retain sets (any exp)."""
    inputs = {
        "model": base_model(wildcards),
        "forget": path("data", exp=wildcards.exp, name="forget"),
        "retain": path("data", exp=wildcards.exp, name="retain"),
    }
    if wildcards.method in ("dpo", "flat"):
        inputs["refusals"] = refusals_file()
    return inputs


def baseline_params(wildcards):
    """qrerase.baselines.text.TextBaselineConfig fields of one method (seed and threads added by the job)."""
    bl = config["baselines"]
    lora = bl["lora"]
    return {
        "method": wildcards.method,
        **bl[wildcards.method],
        "mode": bl["mode"],
        "max_length": bl["max_length"],
        "lora_r": lora["r"],
        "lora_alpha": lora["alpha"],
        "lora_dropout": lora.get("dropout", 0.0),
        "lora_target_modules": list(lora["target_modules"]),
    }


def cost_components(
    exp,
    methods,
    rank,
    erase_rule,
    lora_rule="lora",
    baseline_rule="baseline",
    adapters=None,
):
    """Per method of an experiment, the benchmark files of the jobs that produce its evaluated model.

    Subspace methods: LoRA training (forget + retain; none for a set in `adapters`, given by the
    user), task-matrix extraction, and the closed-form erase (factors of both sets, [energy],
    forget_update, erase). Baselines: their training job. Shared jobs count fully for every method
    that needs them. Rows in the order of `methods`, as in the track's table.
    """
    sets = ("forget", "retain")
    given = adapters or {}

    def bench(rule, name):
        return PATHS["benchmark"].format(rule=rule, name=name)

    out = {}
    for method in methods:
        if method not in DECOMP:
            out[method] = {"baseline_s": [bench(baseline_rule, f"{exp}_{method}")]}
            continue
        decomp = DECOMP[method]
        erase = [bench("factors", f"{exp}_{rank}_{decomp}_{s}") for s in sets]
        if method.endswith("_ll"):
            erase.append(bench("energy", exp))
        erase += [
            bench("forget_update", f"{exp}_{rank}_{decomp}"),
            bench(erase_rule, f"{exp}_{rank}_{method}"),
        ]
        out[method] = {
            "lora_s": [
                bench(lora_rule, f"{exp}_{s}") for s in sets if not given.get(s)
            ],
            "task_matrices_s": [bench("task_matrices", f"{exp}_{s}") for s in sets],
            "erase_s": erase,
        }
    return out


#: track -> header of its cost table's column groups (None: one group, the TOFU experiment).
COST_GROUP_HEADER = {
    "tofu": None,
    "crosslingual": "Unlearn in",
    "speech": "Setting",
    "task": None,
}


def track_costs(track):
    """A track's cost groups, {group: {method: components}}: one per cross-lingual unlearning
    language, one per speech setting, the single '' group of the TOFU experiment."""
    text_erase = (
        "erase_merged" if "merged" in config["erase"]["outputs"] else "erase_adapter"
    )
    given = config["lora"]["adapters"]
    if track == "tofu":
        return {"": cost_components(EXP, METHODS, RANK, text_erase, adapters=given)}
    if track == "crosslingual":
        return {
            code: cost_components(
                xling_exp(code), XLING_METHODS, RANK, text_erase, adapters=given
            )
            for code in XLING_UNLEARN
        }
    if track == "speech":
        return {
            s: cost_components(
                f"speech_{s}",
                SPEECH_METHODS,
                SPEECH_RANK,
                "erase_merged",
                lora_rule="speech_lora",
                baseline_rule="speech_baseline",
            )
            for s in SPEECH_SETTINGS
        }
    if track == "task":
        return {"": task_costs()}  # rules/task.smk
    raise WorkflowError(f"cost: unknown track '{track}'")


def cost_inputs(wildcards):
    """Every benchmark file a track's cost table reads."""
    return [
        f
        for components in track_costs(wildcards.track).values()
        for parts in components.values()
        for files in parts.values()
        for f in files
    ]


def cost_targets(track):
    return expand(PATHS["table"], table=f"{track}_cost", ext=["csv", "md"])


def tofu_baseline_targets():
    return [
        *[path("baseline_curve", exp=EXP, method=m) for m in TOFU_BASELINES],
        *cost_targets("tofu"),
    ]


def tofu_with_baselines_targets():
    """The TOFU track's targets plus the baselines' loss curves and the cost table."""
    return [*tofu_targets(), *tofu_baseline_targets()]


TRACK_TARGETS["tofu"] = tofu_with_baselines_targets


def with_cost_table(track):
    """A track's targets plus its cost table (TOFU's come with the baselines' targets)."""
    targets = TRACK_TARGETS[track]
    return lambda: [*targets(), *cost_targets(track)]


for _track in ("crosslingual", "speech"):
    TRACK_TARGETS[_track] = with_cost_table(_track)


# ---------------------------------------------------------------------------------------------
# Trade-off sweeps (rules/tradeoff.smk): every method's utility-forgetting curve.
# ---------------------------------------------------------------------------------------------
from qrerase.text.tradeoff import scale_name

TRADEOFF = config.get("tradeoff", {})
TRADEOFF_SCALES = [scale_name(s) for s in TRADEOFF.get("scales", [])]
TRADEOFF_RANKS = list(TRADEOFF.get("ranks", [RANK]))
TRADEOFF_EPOCHS = list(TRADEOFF.get("epochs", []))
if TRADEOFF_SCALES and "0" not in TRADEOFF_SCALES:
    raise WorkflowError(
        "config key 'tradeoff.scales': must include 0 (the unedited model: the utility "
        "reference of every curve and the baseline of the lambda rule)"
    )

PATHS.update(
    {
        "tradeoff_erase": "results/{exp}/tradeoff/k{rank}/{method}/lambda{scale}.csv",
        "tradeoff_baseline": "results/{exp}/tradeoff/baselines/{method}_e{epochs}.csv",
        "tradeoff_selection": "results/tables/{track}_tradeoff_selection.csv",
    }
)


def tradeoff_lang(wildcards):
    """The unlearning (= evaluation) language of a cross-lingual point ('xling_hi_R' -> 'hi_R'), else None."""
    exp = wildcards.exp
    return exp[len("xling_") :] if exp.startswith("xling_") else None


def tradeoff_eval_inputs(wildcards):
    """The track's evaluation sets and the retain reference's eval log (TOFU: also the held-out
    retain slice; cross-lingual: the unlearning language X, so a point is the X -> X pair).
    """
    lang = tradeoff_lang(wildcards)
    # keys eval_<set>: a baseline point also reads the training sets forget/retain
    if lang is None:
        return {
            **{f"eval_{s}": f for s, f in eval_data_inputs(wildcards).items()},
            "tune": path("data", exp=wildcards.exp, name="tune_retain"),
            "reference": path("eval", exp=wildcards.exp, model="retain"),
        }
    return {
        **{
            f"eval_{s}": path("xling_sets", lang=lang, name=f"eval_{s}")
            for s in EVAL_SETS
        },
        "reference": path("xling_eval", exp="xling", model="retain"),
    }


def tradeoff_evaluate(wildcards):
    return XLING["evaluate"] if tradeoff_lang(wildcards) else config["tofu"]["evaluate"]


def tradeoff_erase_inputs(wildcards):
    return {
        **erase_inputs(wildcards),
        **tradeoff_eval_inputs(wildcards),
        "model": base_model(wildcards),
    }


def tradeoff_baseline_inputs(wildcards):
    return {**baseline_inputs(wildcards), **tradeoff_eval_inputs(wildcards)}


def tradeoff_points(track):
    """Every sweep point of a text track (TOFU: exp tofu_<split>; cross-lingual: each xling_X)."""
    if track == "tofu":
        exps, methods = [EXP], METHODS
    else:
        exps, methods = [xling_exp(x) for x in XLING_UNLEARN], XLING_METHODS
    return [
        *[
            path("tradeoff_erase", exp=e, rank=k, method=m, scale=s)
            for e in exps
            for m in methods
            if m in DECOMP
            for k in TRADEOFF_RANKS
            for s in TRADEOFF_SCALES
        ],
        *[
            path("tradeoff_baseline", exp=e, method=m, epochs=n)
            for e in exps
            for m in methods
            if m in BASELINES
            for n in TRADEOFF_EPOCHS
        ],
    ]


def tradeoff_targets():
    """The sweeps of every configured track (the speech track's from speech_tradeoff_targets)."""
    outs = [
        out
        for track in ("tofu", "crosslingual")
        if track in config["tracks"]
        for out in (
            path("table", table=f"{track}_tradeoff", ext="csv"),
            path("tradeoff_selection", track=track),
            path("figure", name=f"{track}_tradeoff"),
        )
    ]
    return outs + (speech_tradeoff_targets() if "speech" in config["tracks"] else [])
