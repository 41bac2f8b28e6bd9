#!/usr/bin/env bash
# One command for the greeter: serve the function on :8000, run the module (HTTP ingress on
# :8090), stop both on Ctrl-C. Then, from another terminal:
#   .venv/bin/statefun send example/greeter/Ada hi --call
set -euo pipefail
cd "$(dirname "$0")/../.."
STATEFUN=${STATEFUN:-.venv/bin/statefun}
"$STATEFUN" serve examples.greeter.functions:functions --port 8000 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 50); do
  curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && break
  python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8000/health")' 2>/dev/null && break
  sleep 0.1
done
"$STATEFUN" run examples/greeter/module.yaml
