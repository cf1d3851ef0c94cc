"""The speech track: speaker unlearning on spoken digits with a speaker classifier (the tiny HuBERT
built here, or a checkpoint of a declared speech architecture: :mod:`qrerase.tracks.speech.architectures`).

Its experiments are the shared ``speech`` (data and fine-tuned classifier) and ``speech_<setting>``
(``sample`` / ``class``); its settings are all under ``speech`` (its own model, training sections,
baselines, trade-off); its rules are ``rules/speech/rules.smk`` with ``rules/speech/common.smk``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base import Runner, Track, register_track

#: Frames per second of the HuBERT feature encoder (a sequence is ``max_seconds x 50`` frames); other
#: encoders declare theirs in their shape (Qwen3-Omni's audio encoder: 13).
FRAMES_PER_SECOND = 50
#: Training examples per epoch its memory plan assumes.
PLAN_EXAMPLES = 3000


def frames(cfg: Mapping) -> int:
    """Sequence length of a clip: ``max(1, round(speech.data.max_seconds x f))``, f the encoder's
    positions per second (:func:`speech_shape`; 50 where the shape declares none)."""
    fps = speech_shape(cfg).frames_per_second or FRAMES_PER_SECOND
    return max(1, int(round(float(cfg["speech"]["data"]["max_seconds"]) * fps)))


def check(cfg: Mapping, runs: bool) -> None:
    """The `speech` section (fractions and types are the schema's): ranks within the LoRA rank,
    settings; speakers against the recordings only when the track runs."""
    from ...workflow.validation import ConfigError, check_model_source

    sp = cfg["speech"]
    lora_r = sp["lora"]["r"]
    for k in [sp["rank"], *sp["ranks"], *sp["tradeoff"]["ranks"]]:
        if k > lora_r:
            raise ConfigError(
                f"config key 'speech.rank(s)': rank {k} exceeds the LoRA rank speech.lora.r={lora_r}; "
                "the task matrices have rank at most r"
            )
    if not set(sp["rank_settings"]) <= set(sp["settings"]):
        raise ConfigError(
            f"config key 'speech.rank_settings': {sp['rank_settings']} must be among speech.settings {sp['settings']}"
        )
    if not set(sp["tradeoff"]["settings"]) & set(sp["settings"]):
        raise ConfigError(
            f"config key 'speech.tradeoff.settings': {sp['tradeoff']['settings']} shares no setting with "
            f"speech.settings {sp['settings']}"
        )
    if not runs:
        return  # the checks below need the recordings and the model; a run without the track needs neither
    check_model_source("speech.model", sp["model"], tokenizer=False)
    from ...models.checkpoint_files import is_local_path
    from .architectures import check_speech_checkpoint

    name = sp["model"].get("name_or_path")
    if name is not None and is_local_path(name):
        try:  # its architecture, encoder tensors, feature extractor's rate and LoRA targets
            check_speech_checkpoint(name, sp["data"]["sample_rate"], sp["lora"]["target_modules"])
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    from .data import list_recordings

    root = sp["data"]["root"]
    try:
        recs = list_recordings(root, sp["data"].get("max_per_digit"))
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"config key 'speech.data.root': {exc}") from None
    speakers = sorted({r.speaker for r in recs})
    for name in sp.get("forget_speakers") or []:
        if name not in speakers:
            raise ConfigError(
                f"config key 'speech.forget_speakers': speaker '{name}' not in {root} (speakers: {', '.join(speakers)})"
            )
    if sp.get("forget_speakers") is not None and len(set(sp["forget_speakers"])) >= len(speakers):
        raise ConfigError("config key 'speech.forget_speakers': at least one speaker must be retained")
    if sp["top_k"] > len(speakers):
        raise ConfigError(f"config key 'speech.top_k': {sp['top_k']} exceeds the number of speakers ({len(speakers)})")


def speech_shape(cfg: Mapping) -> Any:
    """The :class:`~qrerase.workflow.shapes.ModelShape` of ``speech.model``: the embedded tiny HuBERT
    (``speech.model.tiny``) when it names no checkpoint and no shape; ``speech.model.shape`` when
    declared; a local checkpoint's by its architecture's declaration (Qwen3-Omni: the audio encoder
    alone); a known hub checkpoint's (:data:`qrerase.tracks.speech.architectures.KNOWN_SPEECH_SHAPES`, then
    :data:`qrerase.workflow.shapes.KNOWN_SHAPES`)."""

    from ...workflow.shapes import ModelShape, resolve_shape
    from .architectures import KNOWN_SPEECH_SHAPES, architecture_for

    m = cfg["speech"]["model"]
    if m.get("name_or_path") is None and not m.get("shape"):
        t = m.get("tiny") or {}
        return ModelShape(
            "tiny-hubert",
            t.get("num_hidden_layers", 4),
            t.get("hidden_size", 64),
            t.get("intermediate_size", 128),
            0,
            t.get("num_attention_heads", 4),
            t.get("num_attention_heads", 4),
            gated_mlp=False,
            frames_per_second=FRAMES_PER_SECOND,
        )
    name = m.get("name_or_path")
    local = Path(str(name)).expanduser() / "config.json"
    if not m.get("shape") and local.is_file():
        import json

        try:
            config = json.loads(local.read_text())
            return architecture_for(config, str(local)).shape(config, str(name))
        except ValueError as exc:
            raise ValueError(f"config key 'speech.model.name_or_path': {exc}") from None
    if not m.get("shape") and name in KNOWN_SPEECH_SHAPES:
        return KNOWN_SPEECH_SHAPES[name][1]
    return resolve_shape(m)


@dataclass(frozen=True)
class SpeechTrack(Track):
    def stage(self, cfg: Mapping, stage: str) -> Any:
        """A speech stage: ``speech.<pretrain|finetune|lora>`` or a baseline (``speech.baselines.common``
        overlaid by ``speech.baselines.<m>``); sequences of :func:`frames` frames."""
        from ... import registry
        from ...workflow.stages import Stage

        sp = cfg["speech"]
        n = frames(cfg)
        ft = ("speech.finetune", sp.get("finetune") or {})
        if stage in ("pretrain", "finetune", "lora"):
            section = dict(sp[stage])
            chain = ((f"speech.{stage}", section),) if stage == "finetune" else ((f"speech.{stage}", section), ft)
            workload = "lora" if stage == "lora" else "train"
            rank = int(section["r"]) if stage == "lora" else 0
            return Stage(f"speech:{stage}", workload, section, chain, 1, max_length=n, lora_rank=rank)
        baselines = sp.get("baselines") or {}
        common, own = baselines.get("common") or {}, baselines.get(stage) or {}
        section = {**common, **own}
        lora_mode = section.get("mode") == "lora"
        plan_shape = registry.method(stage).plan_shape
        seqs, refs = plan_shape or (1, 0)
        return Stage(
            f"speech:{stage}",
            "lora" if lora_mode else "train",
            section,
            ((f"speech.baselines.{stage}", own), ("speech.baselines.common", common), ft),
            2,
            seqs,
            refs,
            n,
            int(section.get("lora_r", 8)) if lora_mode else 0,
            "" if lora_mode else f"use speech.baselines.{stage}.mode: lora",
            plan_shape is not None,
        )

    def plan_jobs(self, cfg: Mapping) -> list:
        """(resource class, job, examples per epoch): its training stages, evaluation, factors and erase."""
        from ... import registry
        from ...workflow.plan import JobSpec
        from ...workflow.stages import processes, stage_job

        sp = cfg["speech"]
        eval_p = processes(cfg, "evaluate")
        n = PLAN_EXAMPLES
        stages = (["pretrain"] if sp["model"].get("name_or_path") is None else []) + ["finetune", "lora"]
        baselines = sp.get("baselines") or {}
        stages += [
            m
            for m in cfg.get("methods", {}).get(self.name, [])
            if registry.method(m).plan_shape is not None and m in baselines
        ]
        jobs = [("train", stage_job(cfg, self.name, stage), n) for stage in stages]
        ev = sp.get("evaluate") or {}
        evaluate = JobSpec("speech:evaluate", "infer", int(ev.get("batch_size", 32)), frames(cfg), processes=eval_p)
        jobs.append(("evaluate", evaluate, n))
        jobs.append(("linalg", JobSpec("speech:factors", "linalg", lora_rank=int(sp["lora"]["r"]), lora_modules=4), 0))
        jobs.append(("linalg", JobSpec("speech:erase_merged", "linalg"), 0))
        return jobs

    def plan_sections(self, cfg: Mapping) -> Mapping:
        return cfg["speech"]

    def planning_model(self, cfg: Mapping) -> tuple[Mapping, Any]:
        return cfg["speech"]["model"], speech_shape(cfg)

    def erase_scale(self, cfg: Mapping) -> float:
        """``speech.scale``."""
        return cfg["speech"]["scale"]


TRACK = register_track(
    SpeechTrack(
        name="speech",
        runner="speech",
        eval_sections=("speech.evaluate",),
        prefix="speech",
        experiments={"speech": "speech", "speech_<setting>": "speech_(sample|class)"},
        shared_models=True,
        pretrain_text=True,
        language_model=False,
        cost_group_header="Setting",
        tables=("speech",),
        paths={  # its artifacts (qrerase.workflow.paths)
            "speech_audio": "results/{exp}/data/audio.safetensors",
            "speech_index": "results/{exp}/data/index.csv",
            "speech_meta": "results/{exp}/data/meta.json",
            "speech_eval": "results/{exp}/speech_eval/{model}.csv",
            "speech_mia": "results/{exp}/speech_eval/{model}_mia.json",
            "speech_baseline": "results/{exp}/baselines/{method}/model",
            "speech_baseline_curve": "results/{exp}/baselines/{method}/loss.csv",
            "speech_pretrained": "results/{exp}/models/pretrained",
            "speech_pretrain_curve": "results/{exp}/models/pretrained_loss.csv",
            "speech_tradeoff_points": "results/{exp}/tradeoff/{method}.csv",
        },
        title="Speech track",
        check="qrerase.tracks.speech:check",
        metrics=True,
        rules="rules/speech/rules.smk",
        schema=Path(__file__).with_name("schema.yaml"),
        runner_spec=Runner(
            description="f(model, data, cfg) -> (model, curve) (qrerase.tracks.speech.baselines.run_baseline)",
            job_class="qrerase.tracks.speech.settings:SpeechBaselineConfig",
            section="speech.baselines",
            required=False,
            sweep_sections=("speech.tradeoff.baselines",),
        ),
        methods="qrerase.tracks.speech.methods",
        metric_fns={"mia_loss": "qrerase.tracks.speech.privacy:loss_score"},
    )
)
