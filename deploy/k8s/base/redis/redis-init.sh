#!/bin/sh
# Runs before redis-server (an init container in Kubernetes, the entrypoint in compose): writes
# what must not appear on redis-server's command line into runtime.conf in REDIS_RUNTIME_DIR, a
# directory in memory. REDIS_PASSWORD comes from the Secret; keep it free of quotes and
# backslashes (hex is).
set -eu
umask 077
dir="${REDIS_RUNTIME_DIR:-/run/redis}"
printf 'requirepass "%s"\n' "$REDIS_PASSWORD" > "$dir/runtime.conf"
