#!/usr/bin/env bash
# Node agent checks on a GPU machine (no kubelet, no API server), in one go:
#   1. inventory: `vramfit-agent run --once` against nvidia-smi (count, UUID,
#      total, model), the probe verdict and the measured context overhead;
#   2. a real PyTorch training process: the agent's per-process figure against
#      nvidia-smi's (within 1 %) and the peak it reports against the run's own
#      NVML peak (within 2 %); meanwhile the agent's CPU time and RSS at 1 s and
#      100 ms intervals;
#   3. the watchdog (`--local-budget PID=BYTES`): a process that exceeds its
#      budget is stopped, a second one on the same GPU keeps training;
#   4. `vramfit run --local` with the agent: a job whose process ignores its
#      22 GiB budget (1 GiB per sample held, 27 GiB at micro 16) is stopped by
#      the agent through its shell parent, the attempt counts as an OOM, and
#      the next attempt at micro 8 (16.5 GiB) trains to the end.
#
# Usage: scripts/gpu/agent_checks.sh [AGENT_BINARY] [OUT_DIR]
#   defaults: .dev-bin/vramfit-agent (release, `cuda` feature) and $OUT/agent;
#   `vramfit` is taken beside the agent (VRAMFIT_BIN overrides).
# Writes OUT_DIR/results.json (every figure and check) and OUT_DIR/log.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
agent=${1:-.dev-bin/vramfit-agent}
vramfit=${VRAMFIT_BIN:-$(dirname "$agent")/vramfit}
out=${2:-${OUT:-/tmp/vramfit-out}/agent}
mkdir -p "$out"
work=$(mktemp -d)
log=$out/log.txt
: >"$log"
export PYTHONUNBUFFERED=1 RUST_LOG=info,kube=warn
# NVRTC for the probe kernels: the toolkit's, or the one PyTorch ships.
nvrtc=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets /opt /usr/lib -name 'libnvrtc.so*' 2>/dev/null | head -1)
[[ -n $nvrtc ]] && export LD_LIBRARY_PATH="$(dirname "$nvrtc"):${LD_LIBRARY_PATH:-}"
say() { printf 'agent_checks: %s\n' "$*" | tee -a "$log" >&2; }
trainer=scripts/gpu/agent_trainer.py

cpu_rss() { # pid -> "cpu_seconds rss_kib hwm_kib"
  python3 - "$1" <<'PY'
import os, sys
pid = sys.argv[1]
f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
ticks = os.sysconf("SC_CLK_TCK")
cpu = (int(f[11]) + int(f[12])) / ticks
st = {l.split(":")[0]: l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith(("VmRSS", "VmHWM"))}
print(cpu, st["VmRSS"], st["VmHWM"])
PY
}

say "1. inventory"
nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used --format=csv,noheader,nounits >"$work/smi_gpus.csv"
"$agent" run --node gpu-check --once -o json --probe-gib 2 >"$work/inventory.json" 2>"$work/inventory.log"
echo "inventory rc=$?" >>"$log"; tail -5 "$work/inventory.log" >>"$log"

say "2. training process, agents at 100 ms and 1 s"
"$agent" run --node gpu-check --standalone --no-probe --interval 100ms --heartbeat 1s \
  --change-threshold-mib 0 --min-write-gap 100ms --status-file "$work/fast.json" 2>"$work/fast.log" &
fast=$!
"$agent" run --node gpu-check --standalone --no-probe --interval 1s \
  --status-file "$work/slow.json" 2>"$work/slow.log" &
slow=$!
sleep 3 # both have measured their context overhead and released it
fast0=$(cpu_rss $fast); slow0=$(cpu_rss $slow); t0=$(date +%s.%N)
python3 $trainer --result "$work/train.json" --phases 8,16,32 --phase-seconds 8 --hold-seconds 6 >>"$log" 2>&1 &
train=$!
# Pairs of (agent figure, nvidia-smi figure) for the trainer, every 0.5 s,
# and the last peak the agent reported for it.
python3 - "$train" "$work/fast.json" "$work/pairs.json" <<'PY' &
import json, os, subprocess, sys, time
pid, status_path, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
pairs, peak = [], 0
while os.path.exists(f"/proc/{pid}"):
    smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    smi_mib = {int(a): int(b) for a, b in (l.split(",") for l in smi.strip().splitlines() if l.strip())}
    try:
        status = json.load(open(status_path))
    except Exception:
        time.sleep(0.5); continue
    for gpu in status.get("gpus", []):
        for p in gpu.get("processes", []):
            if p["pid"] == pid:
                peak = max(peak, p.get("peakBytes", 0))
                if pid in smi_mib:
                    pairs.append({"agentBytes": p["usedBytes"], "smiMiB": smi_mib[pid], "t": time.time()})
    time.sleep(0.5)
json.dump({"pairs": pairs, "agentPeakBytes": peak}, open(out, "w"))
PY
pairs=$!
wait $train; echo "trainer rc=$?" >>"$log"
wait $pairs
t1=$(date +%s.%N); fast1=$(cpu_rss $fast); slow1=$(cpu_rss $slow)
kill $fast $slow; wait $fast $slow 2>/dev/null
tail -3 "$work/fast.log" >>"$log"
echo "{\"wall\": $(python3 -c "print($t1-$t0)"), \"fast\": [\"$fast0\", \"$fast1\"], \"slow\": [\"$slow0\", \"$slow1\"]}" >"$work/cpu.json"

say "3. watchdog: an offender over its budget, a neighbour on the same GPU"
python3 $trainer --result "$work/neighbour.json" --phases 16 --phase-seconds 25 --hold-seconds 0 >>"$log" 2>&1 &
nb=$!
python3 $trainer --result "$work/offender.json" --phases 8 --phase-seconds 25 --hold-seconds 0 --grow-gib 1 >>"$log" 2>&1 &
of=$!
for _ in $(seq 1 120); do
  [[ -f $work/neighbour.json.progress && -f $work/offender.json.progress ]] && break
  sleep 0.25
done
sleep 1
smi=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits)
nb_mib=$(awk -F', ' -v p=$nb '$1==p {print $2}' <<<"$smi")
of_mib=$(awk -F', ' -v p=$of '$1==p {print $2}' <<<"$smi")
# The neighbour gets ample room; the offender 3 GiB above what it uses now
# (it adds 1 GiB a second).
nb_budget=$(( (nb_mib * 2 + 4096) * 1048576 ))
of_budget=$(( (of_mib + 3072) * 1048576 ))
echo "neighbour pid $nb uses ${nb_mib} MiB, budget $nb_budget; offender pid $of uses ${of_mib} MiB, budget $of_budget" >>"$log"
"$agent" run --node gpu-check --no-probe --interval 200ms --grace 2s --tolerance 0.05 \
  --local-budget "$nb=$nb_budget" --local-budget "$of=$of_budget" \
  --status-file "$work/dog.json" 2>"$work/dog.log" &
dog=$!
start=$(date +%s.%N)
wait $of; of_rc=$?
killed_at=$(date +%s.%N)
nb_steps_at_kill=$(python3 -c "import json; print(json.load(open('$work/neighbour.json.progress'))['steps'])")
wait $nb; nb_rc=$?
sleep 0.5
kill $dog; wait $dog 2>/dev/null
grep -E "SIGKILL|stop" "$work/dog.log" | tail -3 >>"$log"
cat >"$work/dog_run.json" <<JSON
{"offenderPid": $of, "offenderRc": $of_rc, "neighbourPid": $nb, "neighbourRc": $nb_rc,
 "offenderBudget": $of_budget, "neighbourBudget": $nb_budget,
 "secondsToKill": $(python3 -c "print($killed_at-$start)"), "neighbourStepsAtKill": $nb_steps_at_kill}
JSON

say "4. vramfit run --local: the agent enforces the budget, the next attempt fits"
cat >"$work/local-job.yaml" <<'YAML'
apiVersion: vramfit.dev/v1alpha1
kind: TrainingJob
metadata: {name: agent-local-check, namespace: ml}
spec:
  gpus: 1
  batch: {global: 64, micro: 16, minMicro: 4}
  maxOOMRetries: 2
  model:
    transformer: {kind: decoder, layers: 8, hidden: 1024, heads: 16, vocab: 32000, seqLen: 512}
    precision: bf16
    optimizer: adamw
  memory: {request: 22Gi}
  template: {spec: {containers: [{name: train, image: x}]}}
YAML
local_start=$(date +%s.%N)
# Through a shell, so the agent must find the python below the attempt's PID.
timeout 150 "$vramfit" run --local "$work/local-job.yaml" --agent "$agent" --workdir "$work/local" \
  --sample-ms 200 -o json -- sh -c 'python3 "$0" --micro-from-env --hoard-gib-per-sample 1 \
  --phase-seconds 20 --hold-seconds 0 --result "$1"; exit $?' "$trainer" "$work/local-train.json" \
  >"$work/local-run.json" 2>>"$log"
echo "run --local rc=$? in $(python3 -c "print(round($(date +%s.%N)-$local_start, 1))") s" >>"$log"
tail -3 "$work"/local/attempt-*/agent.log >>"$log" 2>/dev/null

say "5. results"
python3 - "$work" "$out/results.json" <<'PY' | tee -a "$log"
import json, sys
work, out = sys.argv[1], sys.argv[2]
MIB = 1 << 20
checks, figures = [], {}
def check(name, ok, detail):
    checks.append({"check": name, "ok": bool(ok), "detail": detail})

def load(name):
    try:
        return json.load(open(f"{work}/{name}"))
    except Exception as e:
        return {"error": str(e)}

inv = load("inventory.json")
smi = [l.split(", ") for l in open(f"{work}/smi_gpus.csv").read().strip().splitlines()]
gpus = inv.get("gpus", [])
check("inventory: GPU count matches nvidia-smi", len(gpus) == len(smi), f"agent {len(gpus)}, nvidia-smi {len(smi)}")
for g, s in zip(gpus, smi):
    idx, uuid, name, total_mib = int(s[0]), s[1], s[2], int(s[3])
    check(f"inventory GPU {idx}: UUID", g["uuid"] == uuid, f"{g['uuid']} vs {uuid}")
    check(f"inventory GPU {idx}: total memory", g["totalBytes"] // MIB == total_mib, f"{g['totalBytes'] // MIB} MiB vs {total_mib} MiB")
    check(f"inventory GPU {idx}: model is a predictor profile", g["model"] == "H200" if "H200" in name else bool(g["model"]), f"{name} -> {g['model']}")
    check(f"inventory GPU {idx}: probe ran and passed", (g.get("probe") or {}).get("ok") is True, (g.get("probe") or {}).get("message"))
    check(f"inventory GPU {idx}: context overhead measured", g.get("contextOverheadBytes", 0) > 100 * MIB, f"{g.get('contextOverheadBytes', 0) / MIB:.0f} MiB")
    figures[f"contextOverheadMiB[{idx}]"] = g.get("contextOverheadBytes", 0) / MIB
figures["agentHealth"] = (inv.get("agent") or {}).get("health")

pairs = load("pairs.json")
train = load("train.json")
errs = [abs(p["agentBytes"] / MIB - p["smiMiB"]) / p["smiMiB"] for p in pairs.get("pairs", []) if p["smiMiB"] > 0]
errs.sort()
if errs:
    med, worst = errs[len(errs) // 2], errs[-1]
    figures["perProcessRelErrorMedian"] = med
    figures["perProcessRelErrorMax"] = worst
    figures["perProcessPairs"] = len(errs)
    check("per-process figure vs nvidia-smi within 1 % (median of pairs)", med <= 0.01, f"median {med:.4%}, max {worst:.4%}, {len(errs)} pairs")
else:
    check("per-process figure vs nvidia-smi within 1 %", False, "no pairs (the agent never listed the trainer)")
own = train.get("ownNvmlPeakBytes", 0)
rep = pairs.get("agentPeakBytes", 0)
figures["trainerOwnNvmlPeakMiB"] = own / MIB
figures["agentReportedPeakMiB"] = rep / MIB
check("reported peak vs the run's own NVML peak within 2 %", own > 0 and abs(rep - own) / own <= 0.02,
      f"agent {rep / MIB:.0f} MiB, run {own / MIB:.0f} MiB")
check("training process completed", train.get("completed") is True, f"{train.get('steps')} steps")

cpu = load("cpu.json")
wall = cpu.get("wall", 0)
for key, label in (("fast", "100ms"), ("slow", "1s")):
    a, b = (list(map(float, x.split())) for x in cpu.get(key, ["0 0 0", "0 0 0"]))
    figures[f"agentCpuPercent@{label}"] = 100 * (b[0] - a[0]) / wall if wall else None
    figures[f"agentRssMiB@{label}"] = b[1] / 1024
    figures[f"agentPeakRssMiB@{label}"] = b[2] / 1024
figures["cpuWindowSeconds"] = wall

dog = load("dog_run.json")
status = load("dog.json")
reports = status.get("oomReports", [])
of, nb = dog.get("offenderPid"), dog.get("neighbourPid")
check("watchdog: the offender was stopped by SIGKILL", dog.get("offenderRc") == 137, f"exit status {dog.get('offenderRc')} after {dog.get('secondsToKill', 0):.1f} s")
check("watchdog: an OOM report names the offender", any(r["podName"] == f"pid-{of}" for r in reports), json.dumps(reports)[:300])
check("watchdog: no report names the neighbour", not any(r["podName"] == f"pid-{nb}" for r in reports), "")
nbres = load("neighbour.json")
check("watchdog: the neighbour kept training and finished", dog.get("neighbourRc") == 0 and nbres.get("completed") is True
      and nbres.get("steps", 0) > dog.get("neighbourStepsAtKill", 0),
      f"rc {dog.get('neighbourRc')}, {dog.get('neighbourStepsAtKill')} steps at the kill, {nbres.get('steps')} at the end")
figures["watchdogSecondsToKill"] = dog.get("secondsToKill")

run = load("local-run.json")
attempts = run.get("attempts", [])
first = attempts[0] if attempts else {}
second = attempts[1] if len(attempts) > 1 else {}
check("run --local: the agent stopped attempt 1 (16x4) over its budget, counted as an OOM",
      first.get("outcome") == "OutOfMemory" and bool(first.get("stoppedByAgent")) and first.get("microBatch") == 16,
      f"{first.get('outcome')}, exit {first.get('exitCode')}, {first.get('seconds', 0):.1f} s: {str(first.get('stoppedByAgent') or first.get('message') or run.get('error'))[:200]}")
check("run --local: attempt 2 at 8x8 trained to the end, the job succeeded",
      second.get("microBatch") == 8 and second.get("gradAccum") == 8 and second.get("outcome") == "Succeeded"
      and run.get("outcome") == "Succeeded" and load("local-train.json").get("completed") is True,
      f"{second.get('outcome')} at {second.get('microBatch')}x{second.get('gradAccum')}, job {run.get('outcome')}, {len(attempts)} attempts")
for i, a in enumerate(attempts):
    figures[f"runLocalAttempt{i + 1}PeakMiB"] = (a.get("measuredPeakBytes") or 0) / MIB
    figures[f"runLocalAttempt{i + 1}Seconds"] = a.get("seconds")

result = {"checks": checks, "figures": figures, "inventory": inv, "trainer": train,
          "pairs": pairs.get("pairs", [])[:200], "watchdog": dog, "watchdogStatus": status, "runLocal": run}
json.dump(result, open(out, "w"), indent=1)
for c in checks:
    print(("PASS " if c["ok"] else "FAIL ") + c["check"] + (f": {c['detail']}" if c["detail"] else ""))
for k, v in figures.items():
    print(f"  {k} = {v}")
print(f"{sum(c['ok'] for c in checks)} passed, {sum(not c['ok'] for c in checks)} failed")
PY
