# Cost tables: per track, the wall time of the jobs behind each method's evaluated model, read from
# Snakemake's benchmark files (benchmark_path). Each track's targets list cost_targets(<track>).


include: "cost_common.smk"


rule cost:
    # A track table's companion: wall time of each method's jobs (baseline training vs LoRA +
    # closed-form erase), from Snakemake's benchmark files. Timings differ between runs.
    input:
        cost_inputs,
    output:
        **{
            ext: report(
                path("table", table="{track}_cost", ext=ext),
                caption="../../report/cost_table.rst",
                category="Cost",
                subcategory="{track}",
                labels={"table": "{track}_cost", "format": ext},
            )
            for ext in ("csv", "md")
        },
    log:
        log_path("cost", "track"),
    wildcard_constraints:
        track="|".join(COST_GROUP_HEADER),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        groups=lambda wildcards: track_costs(wildcards.track),
        group_column=lambda wildcards: (
            None if COST_GROUP_HEADER[wildcards.track] is None else "group"
        ),
        group_header=lambda wildcards: COST_GROUP_HEADER[wildcards.track],
    script:
        "../../workflow_scripts/studies/cost.py"
