"""Rule speech_data: read the FSDD WAVs, resample to 16 kHz, split per speaker, cut both partitions."""

from qrerase.io import save_arrays, write_csv, write_json
from qrerase.tracks.speech.data import SpeechDataConfig, make_speech_data
from qrerase.workflow.job import job

with job(snakemake) as log:
    p, out = snakemake.params, snakemake.output
    cfg = SpeechDataConfig.from_dict({**p.data, "seed": p.seed})
    arrays, index, meta = make_speech_data(cfg)
    save_arrays(out.audio, arrays, metadata={"format": "qrerase-speech", "sample_rate": str(cfg.sample_rate)})
    write_csv(out.index, index)
    write_json(out.meta, meta)
    log.info(
        "%d utterances, speakers %s, class-setting forget speakers %s",
        len(index),
        meta["speakers"],
        meta["forget_speakers"],
    )
    for col in ("split", "sample_partition", "class_partition"):
        log.info("%s: %s", col, index[col].value_counts().to_dict())
