# qrerase: subspace-based machine unlearning (QR-Erase, UNLEARN and their layer-localised variants).
# Run: snakemake --cores 2            (embedded default config.yaml)
#      snakemake --cores 2 --configfile tests/configs/test.yaml
import os

from snakemake.utils import min_version

from qrerase.tracks import track_rules

min_version("8.20")


# The embedded default; `--configfile X.yaml` overrides it key by key.
configfile: os.path.join(workflow.basedir, "config.yaml")


# snakemake --report results/report.html (after a run): tables and figures with their captions.
report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/core/common.smk"
include: "rules/core/model.smk"
include: "rules/core/lora.smk"
include: "rules/core/task_matrices.smk"
include: "rules/core/energy.smk"
include: "rules/core/erase.smk"
include: "rules/core/baselines.smk"
include: "rules/studies/cost.smk"


# The rules file of each track (qrerase.tracks.Track.rules): the built-in tracks' rules/<track>/rules.smk
# and those a plug-in registers (config key `plugins`, loaded by rules/common.smk's validation), in
# registration order. After the shared stages' rules above, before the rules whose inputs call every
# configured track's functions (tradeoff, seeds, provenance's `all`).
for _rules in track_rules():

    include: _rules


include: "rules/studies/bench.smk"
include: "rules/studies/tradeoff.smk"
include: "rules/studies/size_study.smk"
include: "rules/studies/seeds.smk"
include: "rules/studies/robustness_common.smk"
include: "rules/studies/robustness.smk"
include: "rules/studies/construction.smk"
include: "rules/studies/provenance.smk"


rule all:
    default_target: True
    input:
        all_targets(),
        path("manifest"),
        manifest_holes(),
