"""Every artifact path of the workflow, in one table: the shared patterns (:data:`SHARED`) and each
registered track's own (:attr:`qrerase.tracks.Track.paths`), filled by :func:`fill`; the log and
benchmark file of a job (:func:`log_path`, :func:`benchmark_path`). Standard library only (the
Snakefile imports it at parse time)."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SHARED", "all_paths", "fill", "log_path", "benchmark_path"]

#: The patterns every track shares: the text chain (data -> model -> LoRA -> task matrices -> factors ->
#: energy -> update -> erase -> evaluate), the baselines, the studies and the shared outputs.
SHARED: dict[str, str] = {
    "data": "results/{exp}/data/{name}.jsonl",
    "tokenizer": "results/{exp}/models/tokenizer",
    "model": "results/{exp}/models/{which}",
    "train_curve": "results/{exp}/models/{which}_loss.csv",
    "imported": "results/{exp}/models/imported",
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
    "baseline_model": "results/{exp}/baselines/{method}/model",
    "baseline_curve": "results/{exp}/baselines/{method}_loss.csv",
    "probe": "results/{exp}/probe/{which}_memorisation.csv",
    # trade-off sweeps
    "tradeoff_erase": "results/{exp}/tradeoff/k{rank}/{method}/lambda{scale}.csv",
    "tradeoff_baseline": "results/{exp}/tradeoff/baselines/{method}_e{epochs}.csv",
    "tradeoff_selection": "results/tables/{track}_tradeoff_selection.csv",
    # the construction study (rules/studies/construction.smk)
    "construction_lora": "results/{exp}/construction/{start}/lora/{set}",
    "construction_lora_curve": "results/{exp}/construction/{start}/lora/{set}_loss.csv",
    "construction_effect": "results/{exp}/construction/{start}/adapter_effect.csv",
    "construction_unedited": "results/{exp}/construction/unedited.csv",
    "construction_sweep": "results/{exp}/construction/{start}/{projector}/k{rank}/{method}.csv",
    "construction_modules": "results/{exp}/construction/{start}/{projector}/k{rank}/{method}_modules.csv",
    "construction_pick": "results/{exp}/construction/{start}/{projector}/k{rank}/{method}_pick.csv",
    "construction_baseline": "results/{exp}/construction/baselines/{method}_e{epochs}.csv",
    # size study
    "size_study_rows": "results/{exp}/size_study/rows.csv",
    "size_study_layers": "results/{exp}/size_study/layers.csv",
    # shared outputs, benchmarks, logs
    "table": "results/tables/{table}.{ext}",
    "figure": "results/figures/{name}.png",
    "bench": "results/bench/{name}.csv",
    "benchmark": "results/benchmarks/{rule}/{name}.tsv",
    "log": "results/logs/{rule}/{name}.log",
    "manifest": "results/provenance/manifest.json",
}


def all_paths(tracks: Mapping) -> dict[str, str]:
    """:data:`SHARED` plus the patterns of each track in ``tracks`` (name -> :class:`~qrerase.tracks.Track`);
    ValueError (one line) for a key two of them define."""
    table = dict(SHARED)
    for t in tracks.values():
        clash = sorted(set(t.paths) & set(table))
        if clash:
            raise ValueError(f"track {t.name!r}: path key(s) {clash} are already defined (Track.paths)")
        table.update(t.paths)
    return table


class _Keep(dict):
    def __missing__(self, key):
        return f"{{{key}}}"


def fill(pattern: str, **wildcards) -> str:
    """Fill a path pattern; an unfilled wildcard stays ``{name}`` (for rule declarations)."""
    return pattern.format_map(_Keep(wildcards))


def _job_name(rule_name: str, wildcard_names, values) -> str:
    name = "_".join(f"{{{w}}}" for w in wildcard_names) or rule_name
    return name.format_map(_Keep(values))


def log_path(rule_name: str, *wildcard_names: str) -> str:
    """A rule's log file: ``results/logs/<rule>/<wildcard values joined by '_'>.log``."""
    return SHARED["log"].format(rule=rule_name, name=_job_name(rule_name, wildcard_names, {}))


def benchmark_path(rule_name: str, *wildcard_names: str, **values) -> str:
    """A job's Snakemake benchmark file (wall time, RSS): ``results/benchmarks/<rule>/<wildcards>.tsv``;
    with ``values`` (wildcard name -> value) one job's file, as the cost table reads it."""
    return SHARED["benchmark"].format(rule=rule_name, name=_job_name(rule_name, wildcard_names, values))
