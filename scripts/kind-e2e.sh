#!/usr/bin/env bash
# One command for users with Docker: a kind cluster, the images, the chart, an example job, a watch.
#
#   scripts/kind-e2e.sh [examples/wordcount.yaml]      # Ctrl-C stops the watch and tears everything down
#   KEEP=1 scripts/kind-e2e.sh                         # leave the cluster running afterwards
#   WATCH_S=300 scripts/kind-e2e.sh                    # watch for 5 minutes, then tear down
#
# Needs docker, kind, kubectl and helm on the PATH. Not run in CI (no Docker engine there).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOB="${1:-$ROOT/examples/wordcount.yaml}"
CLUSTER="streamjobs"          # the name in kind-config.yaml
TAG="${TAG:-0.1.0}"
NAMESPACE="${NAMESPACE:-streamjobs}"
WATCH_S="${WATCH_S:-600}"

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "kind-e2e: '$tool' is not installed" >&2; exit 2; }
done

teardown() {
  if [ "${KEEP:-0}" = 1 ]; then
    echo "kind-e2e: cluster '$CLUSTER' kept (kind delete cluster --name $CLUSTER)"
  else
    kind delete cluster --name "$CLUSTER" || true
  fi
}
trap teardown EXIT

echo "== cluster"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --config "$ROOT/kind-config.yaml" --wait 120s

echo "== images"
docker build -f "$ROOT/docker/worker.Dockerfile" -t "streamjobs/worker:$TAG" "$ROOT"
docker build -f "$ROOT/docker/operator.Dockerfile" -t "streamjobs/operator:$TAG" "$ROOT"
kind load docker-image --name "$CLUSTER" "streamjobs/worker:$TAG" "streamjobs/operator:$TAG"

echo "== operator (helm)"
helm upgrade --install streamjobs "$ROOT/helm/streamjobs" --namespace "$NAMESPACE" --create-namespace \
  --set operator.image.tag="$TAG" --set worker.image.tag="$TAG" \
  --set worker.image.pullPolicy=Never --set operator.image.pullPolicy=Never --wait --timeout 5m

echo "== job $(basename "$JOB")"
kubectl apply --namespace "$NAMESPACE" -f "$JOB"
echo "kind-e2e: watching for ${WATCH_S}s (Ctrl-C to stop); rescale with e.g."
echo "  kubectl -n $NAMESPACE patch sj wordcount --type=json -p '[{\"op\":\"replace\",\"path\":\"/spec/stages/0/parallelism\",\"value\":3}]'"
timeout "$WATCH_S" kubectl get sj --namespace "$NAMESPACE" -w || true
kubectl get statefulsets,pods --namespace "$NAMESPACE"
