#!/usr/bin/env bash
# Submit command for Snakemake's cluster-generic executor, standing in for a scheduler: the job
# script Snakemake wrote (its last argument) is copied to .cluster-jobs/<id>.sh under the working
# directory and run there in the background, in its own process, like on another node; the job id
# goes to stdout. tests/cluster/status.sh <id> reports running / success / failed.
set -euo pipefail
jobscript="${*: -1}"
dir=".cluster-jobs"
mkdir -p "$dir"
id="$(date +%s%N)-$$"
cp "$jobscript" "$dir/$id.sh"
nohup bash -c "bash '$dir/$id.sh' > '$dir/$id.out' 2>&1; echo \$? > '$dir/$id.rc.tmp'; mv '$dir/$id.rc.tmp' '$dir/$id.rc'" \
    > /dev/null 2>&1 < /dev/null &
echo "$id"
