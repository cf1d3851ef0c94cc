"""Rule tokenizer: train the embedded tiny model's byte-level BPE tokenizer on the run's text."""

from qrerase.io import read_jsonl
from qrerase.text.models import train_bpe_tokenizer
from qrerase.workflow.job import job

with job(snakemake) as log:
    texts = []
    for path in snakemake.input:
        for rec in read_jsonl(path):
            texts += [rec["question"], rec["answer"], rec.get("paraphrased_answer", "")]
            texts += list(rec.get("perturbed_answer", []))
    texts = [t for t in texts if t]
    digits = bool(getattr(snakemake.params, "individual_digits", False))
    tok = train_bpe_tokenizer(texts, snakemake.params.vocab_size, snakemake.output[0], individual_digits=digits)
    log.info("tokenizer: %d texts, vocabulary %d", len(texts), len(tok))
