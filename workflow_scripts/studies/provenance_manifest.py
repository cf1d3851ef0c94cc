"""Rule provenance_manifest: the artifact graph (nodes with sha256, input -> output edges) of the targets."""

from qrerase.io import write_json
from qrerase.workflow.job import job
from qrerase.workflow.manifest import build_manifest

with job(snakemake) as log:
    manifest = build_manifest([str(t) for t in snakemake.input])
    write_json(snakemake.output[0], manifest)
    log.info("manifest: %d artifacts, %d edges", len(manifest["artifacts"]), len(manifest["edges"]))
