"""Rule xling_romanise: a romanised language '<lang>_R' as six new split files (vendored data untouched)."""

from qrerase.io import read_jsonl, write_jsonl
from qrerase.tracks.crosslingual.data import check_records, parse_language, romanise_split
from qrerase.workflow.job import job

with job(snakemake) as log:
    _, script = parse_language(snakemake.wildcards.lang)
    splits = list(snakemake.output.keys())
    converted = {}
    for split, src in zip(splits, snakemake.input):
        rows = read_jsonl(src)
        check_records(rows, split, src)
        converted[split] = romanise_split(rows, script)
    for split, rows in converted.items():
        write_jsonl(snakemake.output[split], rows)
        log.info("%s: %d records romanised (%s)", split, len(rows), script)
