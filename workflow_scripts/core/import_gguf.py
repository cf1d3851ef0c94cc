"""Rule import_gguf: a GGUF model dequantised into a safetensors checkpoint (qrerase.models.gguf.import_gguf);
the GGUF file and its sha256 go to the log and, as the rule's input, to the provenance record."""

from qrerase.models.gguf import import_gguf
from qrerase.workflow.job import job

with job(snakemake) as log:
    info = import_gguf(snakemake.input.gguf, snakemake.output.model, dtype=snakemake.params.dtype)
    log.info(
        "imported %s (sha256 %s): %s, %d parameters, dequantised to %s",
        info["gguf_file"],
        info["sha256"],
        info["architecture"],
        info["parameters"],
        snakemake.params.dtype,
    )
