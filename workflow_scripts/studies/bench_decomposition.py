"""Rule bench_decomposition: dense SVD / dense CPQR vs the exact factored paths (paper §6.1 table)."""

from qrerase.bench.decomposition import run_decomposition_benchmark
from qrerase.bench.threads import set_blas_threads
from qrerase.workflow.job import job

with job(snakemake) as log:
    p, out = snakemake.params, snakemake.output
    set_blas_threads(snakemake.threads)
    run_decomposition_benchmark(
        p.sizes,
        out.csv,
        out.plot,
        out.table_csv,
        out.table_md,
        out.table_tex,
        lora_rank=p.lora_rank,
        repeats=p.repeats,
        seed=p.seed,
        max_dense_svd=p.max_dense_svd,
        progress=log.info,
    )
