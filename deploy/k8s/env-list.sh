#!/bin/sh
# The `--env` list of every ready ragen-serve pod behind the headless
# Service (deploy/k8s/serve.yaml), for a trainer inside the cluster:
#   ragen-host train --env "$(deploy/k8s/env-list.sh)" --out runs/k8s
# SERVICE and PORT override the defaults; outside the cluster, use
# `kubectl get pods -l app=ragen-serve -o wide` and its pod IPs.
set -eu
service="${SERVICE:-ragen-serve.default.svc.cluster.local}"
port="${PORT:-8000}"
getent ahostsv4 "$service" | awk -v port="$port" '{print $1}' | sort -u | sed "s|^|ws://|; s|\$|:$port|" | paste -sd, -
