#!/usr/bin/env bash
# `make e2e-kind`: the e2e scenarios against a real Kubernetes control plane in kind.
#
#   1. a kind cluster (e2e/kind/cluster.yaml: 1 control plane + 4 workers), every node Ready
#   2. the cluster's own Deployments (CoreDNS, local-path-provisioner) pinned to the control plane:
#      the scenarios drain GPU nodes with scope "all", which would evict them from a worker
#   3. the workers become simulated GPU nodes: labelled, and nvidia.com/gpu (8, as many GPUs as
#      gpu-sim simulates) patched onto their status. The kubelet keeps an extended resource it does
#      not manage; a background loop re-patches it anyway should it ever vanish.
#   4. both images built and loaded (gpuremediate:dev, gpu-sim:dev)
#   5. every kustomization dry-run on the server, then manifests/overlays/kind applied and rolled out
#   6. python -m pytest e2e, with GPUREMEDIATE_E2E_TARGET=kubeconfig (skip reasons listed)
#   7. on failure, logs/events/nodes into $ARTIFACTS; the cluster is always deleted
#
# Environment: KIND_CLUSTER_NAME, KIND_NODE_IMAGE, ARTIFACTS (default out/e2e-kind),
# PYTHON (default .venv/bin/python, else python3), PYTEST_ARGS (extra pytest arguments, e.g. "-k xid79"),
# KEEP_CLUSTER=1 to leave the cluster up for debugging.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLUSTER="${KIND_CLUSTER_NAME:-gpuremediate-e2e}"
ARTIFACTS="${ARTIFACTS:-$ROOT/out/e2e-kind}"
GPUS_PER_NODE=8  # gpu-sim's --gpus in manifests/overlays/kind/gpu-sim.yaml; the scenarios use GPUs 0-6
GPU_LABEL="nvidia.com/gpu.present"
CONTROL_PLANE_LABEL="node-role.kubernetes.io/control-plane"
WORKDIR=""  # private temp dir: the kubeconfig (admin credentials stay out of $ARTIFACTS), image archives
KUBECONFIG_FILE=""
KEEPER_PID=""

log() { printf '[e2e-kind %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 2; }

require_tools() {
  command -v docker >/dev/null 2>&1 || die "docker not found (https://docs.docker.com/engine/install/)"
  docker info >/dev/null 2>&1 || die "docker is installed but its engine is not reachable"
  command -v kind >/dev/null 2>&1 || die "kind not found (https://kind.sigs.k8s.io/docs/user/quick-start/)"
  command -v kubectl >/dev/null 2>&1 || die "kubectl not found (https://kubernetes.io/docs/tasks/tools/)"
  [[ -f "$ROOT/sim/Dockerfile" ]] || die "sim/Dockerfile (the gpu-sim image) is missing"
  if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
  fi
  "$PYTHON" -c 'import pytest' 2>/dev/null || die "$PYTHON has no pytest (run: make test, which installs it)"
}

collect_artifacts() {
  log "collecting logs into $ARTIFACTS"
  local dir="$ARTIFACTS"
  mkdir -p "$dir"
  kubectl get nodes -o yaml >"$dir/nodes.yaml" 2>&1 || true
  # creationTimestamp: every Event has one (lastTimestamp is empty on events.k8s.io-written ones)
  kubectl get events -A --sort-by=.metadata.creationTimestamp -o wide >"$dir/events.txt" 2>&1 || true
  kubectl get pods -A -o wide >"$dir/pods.txt" 2>&1 || true
  kubectl -n gpuremediate-system logs -l app.kubernetes.io/name=gpuremediate --all-containers \
    --prefix --tail=-1 >"$dir/controller.log" 2>&1 || true
  kubectl -n gpuremediate-system logs -l app.kubernetes.io/name=gpuremediate --all-containers \
    --prefix --previous --tail=-1 >"$dir/controller-previous.log" 2>&1 || true
  kubectl -n gpu-operator logs -l app=nvidia-dcgm-exporter --prefix --tail=-1 >"$dir/gpu-sim.log" 2>&1 || true
  kubectl -n gpuremediate-jobs get jobs,pods -o yaml >"$dir/jobs.yaml" 2>&1 || true
  kubectl -n gpuremediate-jobs logs -l job-name --prefix --tail=-1 >"$dir/jobs.log" 2>&1 || true
  kubectl get maintenancerequests -o yaml >"$dir/maintenancerequests.yaml" 2>&1 || true
  kubectl -n gpuremediate-system get deployments,leases,configmaps -o yaml >"$dir/system.yaml" 2>&1 || true
  kind export logs "$dir/kind-logs" --name "$CLUSTER" >/dev/null 2>&1 || true
}

cleanup() {
  local rc=$?
  trap - EXIT
  if [[ -n "$KEEPER_PID" ]]; then kill "$KEEPER_PID" 2>/dev/null || true; fi
  if [[ $rc -ne 0 ]] && [[ -f "$KUBECONFIG_FILE" ]]; then collect_artifacts; fi
  if [[ "${KEEP_CLUSTER:-0}" == "1" ]]; then
    log "KEEP_CLUSTER=1: cluster $CLUSTER left running (kubeconfig $KUBECONFIG_FILE)"
  else
    log "deleting cluster $CLUSTER"
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    rm -rf "$WORKDIR"
  fi
  exit "$rc"
}

create_cluster() {
  local image_args=()
  if [[ -n "${KIND_NODE_IMAGE:-}" ]]; then image_args=(--image "$KIND_NODE_IMAGE"); fi
  kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  log "creating cluster $CLUSTER"
  # --wait covers the control plane only; the workers are waited for below.
  kind create cluster --name "$CLUSTER" --config "$ROOT/e2e/kind/cluster.yaml" \
    --kubeconfig "$KUBECONFIG_FILE" --wait 180s ${image_args[@]+"${image_args[@]}"}
}

wait_nodes_ready() {
  kubectl wait --for=condition=Ready nodes --all --timeout=180s >/dev/null
}

# CoreDNS must survive the drains: a Job that cannot resolve gpu-sim's Service fails its repair.
pin_system_deployments() {
  local patch ns deploy
  patch="{\"spec\":{\"template\":{\"spec\":{\"nodeSelector\":{\"$CONTROL_PLANE_LABEL\":\"\"},"
  patch+="\"tolerations\":[{\"key\":\"$CONTROL_PLANE_LABEL\",\"operator\":\"Exists\",\"effect\":\"NoSchedule\"},"
  patch+="{\"key\":\"CriticalAddonsOnly\",\"operator\":\"Exists\"}]}}}}"
  for ns in kube-system local-path-storage; do
    for deploy in $(kubectl -n "$ns" get deployments -o name); do
      log "pinning $ns/$deploy to the control plane"
      kubectl -n "$ns" patch "$deploy" --type=merge -p "$patch" >/dev/null
      kubectl -n "$ns" rollout status "$deploy" --timeout=180s
    done
  done
}

worker_nodes() {
  kubectl get nodes -l "!$CONTROL_PLANE_LABEL" -o jsonpath='{.items[*].metadata.name}'
}

# JSON patch on the node's /status: the request of Kubernetes' "Advertise Extended Resources for a
# Node" task (there through kubectl proxy + curl), here through kubectl's --subresource.
patch_gpu_capacity() {
  local node="$1"
  local patch
  patch="[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"$GPUS_PER_NODE\"},"
  patch+="{\"op\":\"add\",\"path\":\"/status/allocatable/nvidia.com~1gpu\",\"value\":\"$GPUS_PER_NODE\"}]"
  kubectl patch node "$node" --subresource=status --type=json -p "$patch" >/dev/null
}

gpu_capacity_of() {
  kubectl get node "$1" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}'
}

make_gpu_nodes() {
  local node
  for node in $(worker_nodes); do
    log "GPU node: $node ($GPUS_PER_NODE simulated GPUs)"
    kubectl label node "$node" --overwrite "$GPU_LABEL=true" nvidia.com/gpu.count="$GPUS_PER_NODE" \
      nvidia.com/gpu.product=gpu-sim >/dev/null
    patch_gpu_capacity "$node"
    [[ "$(gpu_capacity_of "$node")" == "$GPUS_PER_NODE" ]] || die "$node: nvidia.com/gpu did not stick"
  done
}

keep_gpu_capacity() {
  local node
  while true; do
    sleep 5
    for node in $(worker_nodes 2>/dev/null || true); do
      if [[ "$(gpu_capacity_of "$node" 2>/dev/null || true)" != "$GPUS_PER_NODE" ]]; then
        log "$node lost nvidia.com/gpu: patching it back"
        patch_gpu_capacity "$node" 2>/dev/null || true
      fi
    done
  done
}

# Docker's containerd image store can save an archive that kind cannot import ("content digest ...
# not found", kind#3795); an archive of the host's platform alone loads.
load_image() {
  local image="$1" archive platform
  if kind load docker-image "$image" --name "$CLUSTER"; then return 0; fi
  log "kind load docker-image $image failed: loading a single-platform archive instead"
  archive="$WORKDIR/image.tar"
  platform="$(docker version --format '{{.Server.Os}}/{{.Server.Arch}}')"
  docker image save --platform "$platform" -o "$archive" "$image"
  kind load image-archive "$archive" --name "$CLUSTER"
  rm -f "$archive"
}

build_and_load_images() {
  log "building images"
  docker build -t gpuremediate:dev -f "$ROOT/Dockerfile" "$ROOT"
  docker build -t gpu-sim:dev -f "$ROOT/sim/Dockerfile" "$ROOT"
  log "loading images into $CLUSTER"
  load_image gpuremediate:dev
  load_image gpu-sim:dev
}

ensure_namespace() {
  kubectl create namespace "$1" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
}

dry_run_and_apply() {
  # A server dry-run cannot create namespaces for the objects that follow, so make them first.
  # No kustomization holds a custom resource, so no CRD has to exist before a dry-run.
  local ns dir
  for ns in gpuremediate-system gpuremediate-jobs gpu-operator; do ensure_namespace "$ns"; done
  for dir in base overlays/dry-run overlays/nvsentinel-compat overlays/kind plugins/drain-window dcgm-exporter; do
    log "server dry-run: manifests/$dir"
    kubectl apply --dry-run=server -k "$ROOT/manifests/$dir" >/dev/null
  done
  # monitoring needs the Prometheus Operator's CRDs, which kind lacks: render it only.
  kubectl kustomize "$ROOT/manifests/monitoring" >/dev/null
  log "applying manifests/overlays/kind"
  kubectl apply -k "$ROOT/manifests/overlays/kind"
  kubectl wait --for=condition=Established crd/maintenancerequests.gpuremediate.io --timeout=60s
  kubectl -n gpu-operator rollout status daemonset/gpu-sim --timeout=180s
  kubectl -n gpuremediate-system rollout status deployment/gpuremediate --timeout=180s
}

run_scenarios() {
  log "running e2e scenarios"
  local extra=()
  if [[ -n "${PYTEST_ARGS:-}" ]]; then read -r -a extra <<<"$PYTEST_ARGS"; fi
  (cd "$ROOT" && GPUREMEDIATE_E2E_TARGET=kubeconfig KUBECONFIG="$KUBECONFIG_FILE" \
    "$PYTHON" -m pytest e2e -q -rs -p no:cacheprovider ${extra[@]+"${extra[@]}"})
}

main() {
  require_tools
  mkdir -p "$ARTIFACTS"
  WORKDIR="$(mktemp -d "${TMPDIR:-/tmp}/gpuremediate-e2e-kind.XXXXXX")"
  KUBECONFIG_FILE="$WORKDIR/kubeconfig"
  trap cleanup EXIT
  create_cluster
  export KUBECONFIG="$KUBECONFIG_FILE"
  wait_nodes_ready
  pin_system_deployments
  make_gpu_nodes
  keep_gpu_capacity &
  KEEPER_PID=$!
  build_and_load_images
  dry_run_and_apply
  run_scenarios
  log "e2e on kind passed"
}

main "$@"
