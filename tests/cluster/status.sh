#!/usr/bin/env bash
# Status command for Snakemake's cluster-generic executor (see submit.sh): running, success or failed.
set -euo pipefail
rc_file=".cluster-jobs/$1.rc"
if [[ ! -f "$rc_file" ]]; then
    echo running
elif [[ "$(cat "$rc_file")" == 0 ]]; then
    echo success
else
    echo failed
fi
