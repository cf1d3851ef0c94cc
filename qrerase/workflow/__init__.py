"""Glue between Snakemake jobs and the library: the job context, provenance, config checks."""
