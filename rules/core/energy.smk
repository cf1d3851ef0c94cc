rule energy:
    # Eqs. 14-15: normalised task energy E_l and the layers with E_l >= 1/|L|.
    input:
        path("task_matrix", set="forget"),
    output:
        csv=path("energy"),
        selected=path("selected"),
        figure=report(
            path("energy_fig"),
            caption="../../report/energy.rst",
            category="Layer energy",
            subcategory="{exp}",
            labels={"figure": "layer energy", "experiment": "{exp}"},
        ),
    log:
        log_path("energy", "exp"),
    benchmark:
        benchmark_path("energy", "exp")
    conda:
        "../../envs/linalg.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        granularity=config["unlearn"]["energy_granularity"],
    script:
        "../../workflow_scripts/core/energy.py"
