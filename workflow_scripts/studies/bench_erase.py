"""Rule bench_erase: wall time and peak RSS of a whole-model erase with Llama-3-8B / 70B shapes."""

from qrerase.bench.whole_model_erase import run_erase_benchmark
from qrerase.workflow.job import job

with job(snakemake) as log:
    p = snakemake.params
    run_erase_benchmark(
        p.model_shapes,
        snakemake.output[0],
        lora_rank=p.lora_rank,
        seed=p.seed,
        threads=snakemake.threads,
        progress=log.info,
    )
