#!/usr/bin/env bash
# Start Ray on one machine of a Tandem cluster: the head, or a worker joining it.
#
#   scripts/launch_cluster.sh head   [--port 6379] [--resources JSON] [--labels k=v,...]
#   scripts/launch_cluster.sh worker HEAD_IP:6379 [--resources JSON] [--labels k=v,...]
#
# Without --resources a machine with NVIDIA GPUs advertises them by model as a
# custom resource, e.g. {"gpu_H100": 8}, and the label gpu=H100, so a cluster spec
# can put prefill on one GPU type and decode on another:
#
#   prefill: {resources: {gpu_H100: 1}, num_gpus: 1}
#   decode:  {resources: {gpu_L40S: 1}, num_gpus: 1}
#
# Then, on the head: tandem serve --address auto --config spec.yaml --host 0.0.0.0
# Extra arguments after the options go to `ray start` as they are (e.g. --node-ip-address).
set -euo pipefail

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 ]] || usage
role=$1; shift
head_address=""
if [[ $role == worker ]]; then
  [[ $# -ge 1 ]] || usage
  head_address=$1; shift
elif [[ $role != head ]]; then
  usage
fi

port=6379 resources="" labels="" extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --port) port=$2; shift 2 ;;
    --resources) resources=$2; shift 2 ;;
    --labels) labels=$2; shift 2 ;;
    -h|--help) usage ;;
    *) extra+=("$1"); shift ;;
  esac
done

# A GPU model name ("NVIDIA H100 80GB HBM3") -> a resource name ("gpu_H100").
gpu_kind() { awk '{for (i = 1; i <= NF; i++) if ($i ~ /[0-9]/ && $i != "NVIDIA") {print "gpu_" $i; exit}}'; }

if [[ -z $resources ]] && command -v nvidia-smi >/dev/null 2>&1; then
  names=$(nvidia-smi --query-gpu=name --format=csv,noheader || true)
  if [[ -n $names ]]; then
    kind=$(head -n1 <<<"$names" | gpu_kind)
    count=$(wc -l <<<"$names")
    resources="{\"$kind\": $count}"
    labels=${labels:+$labels,}gpu=${kind#gpu_}
  fi
fi

args=()
[[ -n $resources ]] && args+=(--resources "$resources")
[[ -n $labels ]] && args+=(--labels "$labels")
ray stop >/dev/null 2>&1 || true
if [[ $role == head ]]; then
  exec ray start --head --port "$port" "${args[@]}" "${extra[@]}"
else
  exec ray start --address "$head_address" "${args[@]}" "${extra[@]}"
fi
