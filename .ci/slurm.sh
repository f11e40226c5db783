#!/usr/bin/env bash
# CI step: the SLURM path of the README, for real. Installs Debian's slurm-wlm and
# munge when missing, starts a one-node cluster bound to 127.0.0.1 (configuration,
# state and logs in a temporary folder; nothing under /etc/slurm is touched), then
# runs `simulate_all` and one bench job through `snakemake --executor slurm` with the
# repository's workflow/profiles/slurm, in a copy of the workflow. State and logs live
# in a temporary folder; the configuration goes to /etc/slurm/slurm.conf (srun inside
# a job reads only that) and is removed afterwards. Skips, saying why, where the
# cluster cannot start (not root, no apt, no slurmctld, a SLURM already configured).
# Run it from the repository root inside the project's virtual environment.
set -euo pipefail

skip() { echo "SLURM CI step SKIPPED: $*"; exit 0; }

repo=$(pwd)
[ -f "$repo/Snakefile" ] || { echo ".ci/slurm.sh: run it from the repository root" >&2; exit 2; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    [ "$(id -u)" = 0 ] || skip "slurm-wlm/munge are not installed and this is not root"
    command -v apt-get >/dev/null || skip "slurm-wlm/munge are not installed and there is no apt-get"
    echo "== installing slurm-wlm and munge (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || skip "apt-get update failed"
    apt-get install -y -qq slurm-wlm munge >/dev/null || skip "apt-get install slurm-wlm munge failed"
fi
[ "$(id -u)" = 0 ] || skip "starting slurmd needs root"
python -c "import snakemake_executor_plugin_slurm" 2>/dev/null \
    || python -m pip install --quiet snakemake-executor-plugin-slurm \
    || skip "snakemake-executor-plugin-slurm cannot be installed"

[ -e /etc/slurm/slurm.conf ] && skip "/etc/slurm/slurm.conf exists: this step does not touch a configured SLURM"
work=$(mktemp -d /tmp/paraplan-slurm.XXXXXX)
conf=/etc/slurm/slurm.conf
mkdir -p /etc/slurm "$work/state" "$work/spool" "$work/log" "$work/munge"
host=$(hostname -s)

cleanup() {
    for pidfile in "$work/slurmd.pid" "$work/slurmctld.pid" "$work/munge/munged.pid"; do
        [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
    rm -f "$conf"
}
trap cleanup EXIT

# ---- munge: a key of our own, a daemon on a socket of our own
dd if=/dev/urandom bs=1 count=1024 of="$work/munge/munge.key" 2>/dev/null
chmod 0400 "$work/munge/munge.key"
munge_socket="$work/munge/munge.socket"
munged --force --key-file="$work/munge/munge.key" --socket="$munge_socket" \
    --pid-file="$work/munge/munged.pid" --log-file="$work/log/munged.log" \
    --seed-file="$work/munge/munged.seed" \
    || skip "munged does not start (see $work/log/munged.log)"

# ---- one node with 16 CPUs and 16 GB declared (the profile's largest request;
# config_overrides lets slurmd take the declaration over the real hardware)
cat > "$conf" <<CONF
ClusterName=paraplan-ci
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge_socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=16 RealMemory=16000 State=UNKNOWN
PartitionName=ci Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF


slurmctld -f "$conf" || skip "slurmctld does not start (see $work/log/slurmctld.log)"
slurmd -f "$conf" || skip "slurmd does not start (see $work/log/slurmd.log)"
for _ in $(seq 1 30); do
    state=$(sinfo -h -N -o %t 2>/dev/null | head -n1 || true)
    [ "$state" = idle ] && break
    sleep 1
done
[ "${state:-}" = idle ] || { tail -n 20 "$work/log/slurmctld.log" "$work/log/slurmd.log" >&2 || true;
                             skip "the node did not become idle (state '${state:-none}')"; }
echo "== one-node SLURM cluster up: $(sinfo -h -o '%P %D %c %m %t')"

# ---- the workflow, in a copy, through the executor with the repository's profile
run="$work/run"
mkdir -p "$run"
cp -r "$repo/Snakefile" "$repo/workflow" "$repo/config" "$repo/profiles" "$repo/environment.yml" "$run/"
cat > "$run/ci-slurm.yaml" <<YAML
bench: {world_sizes: [2], collectives: [all_reduce], min_bytes: 1024, max_bytes: 65536, factor: 4,
        warmup: 1, iters: 3}
simulate: {studies: [distir_fig3, distir_fig4, schedules], repeats: 1}
YAML
cd "$run"
start=$(date +%s)
snakemake --workflow-profile workflow/profiles/slurm --configfile ci-slurm.yaml \
    --slurm-no-account --slurm-status-command squeue --slurm-init-seconds-before-status-checks 1 \
    --latency-wait 5 simulate_all results/collectives/local-cpu/all_reduce_n2.csv
took=$(( $(date +%s) - start ))
for f in results/simulations/distir_fig3/results.csv results/simulations/distir_fig4/results.csv \
         results/simulations/schedules/results.csv results/collectives/local-cpu/all_reduce_n2.csv; do
    [ -s "$f" ] || { echo "SLURM CI step FAILED: $f was not written" >&2; exit 1; }
done
jobs=$(squeue -h -t all -o %i | wc -l)
[ "$jobs" -ge 4 ] || { echo "SLURM CI step FAILED: $jobs SLURM jobs, expected 4" >&2; exit 1; }
# a gloo (CPU) config asks sbatch for no GPU
if squeue -h -t all -o '%b' | grep -qv 'N/A'; then
    echo "SLURM CI step FAILED: a job of a CPU config asked for GPUs: $(squeue -h -t all -o '%j %b')" >&2
    exit 1
fi
echo "SLURM CI step passed: simulate_all + 1 bench job as $jobs SLURM jobs (no GPU asked) in ${took} s"
