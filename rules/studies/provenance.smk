rule provenance_manifest:
    # The artifact graph behind the default target, from the per-output provenance records.
    input:
        all_targets(),
    output:
        path("manifest"),
    log:
        log_path("provenance_manifest"),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    script:
        "../../workflow_scripts/studies/provenance_manifest.py"
