"""The cross-lingual track: TOFU translated (and romanised), unlearning in one language, evaluated in all.

Its experiments are the shared ``xling`` (data and fine-tuned models) and ``xling_<lang>`` (unlearning
in ``<lang>``); its settings are ``crosslingual`` (its ``pretrain`` / ``finetune`` / ``lora`` override the
top-level ones); its rules are ``rules/crosslingual/rules.smk`` with ``rules/crosslingual/common.smk``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..base import Track, register_track, section_at

#: A cross-lingual language code: ISO 639-1, '_R' for its romanised copy ('hi', 'hi_R').
LANG_PATTERN = r"[a-z]{2}(_R)?"
ROMANISED_LANG_PATTERN = r"[a-z]{2}_R"


def crosslingual_root(code: str, cfg: Mapping) -> str:
    """The folder of a (non-romanised) language's six TOFU splits: TOFU itself for English."""
    data = cfg["crosslingual"]["data"]
    return data["english_root"] if code == "en" else str(Path(data["root"]) / code)


def check(cfg: Mapping, runs: bool) -> None:
    """The 'crosslingual' section: language codes, table method; data files only when the track runs."""
    from ...workflow.validation import ConfigError
    from .data import check_language_files, parse_language

    xl = cfg.get("crosslingual")
    if xl is None or TRACK.name not in cfg["methods"]:
        if runs:
            raise ConfigError(
                "config key 'crosslingual': the crosslingual track needs a 'crosslingual' section "
                "and 'methods.crosslingual'"
            )
        return
    for key in ("languages", "unlearn"):
        for i, code in enumerate(xl[key]):
            try:
                parse_language(code)
            except ValueError as exc:
                raise ConfigError(f"config key 'crosslingual.{key}[{i}]': {exc}") from None
    for i, code in enumerate(xl["unlearn"]):
        if code not in xl["languages"]:
            raise ConfigError(
                f"config key 'crosslingual.unlearn[{i}]': '{code}' is not in crosslingual.languages {xl['languages']}"
            )
    if xl["table_method"] not in cfg["methods"]["crosslingual"]:
        raise ConfigError(
            f"config key 'crosslingual.table_method': '{xl['table_method']}' is not in "
            f"methods.crosslingual {cfg['methods']['crosslingual']}"
        )
    if not runs:
        return
    for code in dict.fromkeys(parse_language(c)[0] for c in xl["languages"]):
        try:
            check_language_files(crosslingual_root(code, cfg))
        except (ValueError, FileNotFoundError) as exc:
            root = "english_root" if code == "en" else "root"
            raise ConfigError(f"config key 'crosslingual.data.{root}': {exc}") from None


@dataclass(frozen=True)
class CrosslingualTrack(Track):
    def examples(self, cfg: Mapping) -> int:
        """20 examples per author, in every configured language."""
        langs = len(section_at(cfg, self.section).get("languages", [1]))
        return super().examples(cfg) * max(1, langs)


TRACK = register_track(
    CrosslingualTrack(
        name="crosslingual",
        runner="text",
        overrides=("crosslingual",),
        eval_sections=("crosslingual.evaluate",),
        prefix="xling",
        experiments={"xling": "xling", "xling_<lang>": rf"xling_{LANG_PATTERN}"},
        shared_models=True,
        pretrain_text=True,
        smoke=True,
        sweep_language=True,
        cost_group_header="Unlearn in",
        tables=("crosslingual",),
        paths={  # its artifacts (qrerase.workflow.paths)
            "xling_romanised": "results/xling/romanised/{lang}/{split}.jsonl",
            "xling_sets": "results/xling/languages/{lang}/{name}.jsonl",
            "xling_eval": "results/{exp}/eval_languages/{model}",
            "xling_metrics": "results/xling/metrics.csv",
            "xling_energy": "results/xling/energy.csv",
        },
        title="Cross-lingual track",
        page_prefixes=("crosslingual", "xling"),
        check="qrerase.tracks.crosslingual:check",
        rules="rules/crosslingual/rules.smk",
        schema=Path(__file__).with_name("schema.yaml"),
        methods="qrerase.tracks.crosslingual.methods",
    )
)
