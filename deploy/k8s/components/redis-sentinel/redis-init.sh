#!/bin/sh
# Runs in the init container of every pod of the redis StatefulSet with Sentinels, before
# redis-server and its Sentinel start; replaces the base's redis-init.sh (same ConfigMap key).
#
# Writes, with the password never on a command line:
#   $REDIS_RUNTIME_DIR/runtime.conf  (memory) the data node's password, the name it announces,
#                                    and which node it replicates, unless it is the primary;
#   $SENTINEL_CONF                   (the data volume) the Sentinel's configuration, which the
#                                    Sentinel rewrites as it learns; kept across restarts so that
#                                    its identity and its last known primary survive them.
#
# The primary is, in this order: what the running Sentinels say (the Service redis-sentinel),
# else what this pod's Sentinel last knew (a restart of the whole set), else the first pod.
#
# From the environment: POD_NAME, POD_NAMESPACE (downward API), REDIS_PASSWORD (the Secret; keep
# it free of quotes and backslashes, as hex is), MASTER_SET (the name clients ask the Sentinels
# for, `skein`), QUORUM (Sentinels that must agree a primary is down, 2 of 3).
set -eu
umask 077
run="${REDIS_RUNTIME_DIR:-/run/redis}"
conf="${SENTINEL_CONF:-/data/sentinel.conf}"
port="${REDIS_PORT:-6379}"
sentinel_port="${SENTINEL_PORT:-26379}"
sentinels="${SENTINEL_SERVICE:-redis-sentinel}"
headless="${HEADLESS_SERVICE:-redis-headless}"
# Names in the namespace's own DNS domain, whatever the cluster's domain is.
self="${ANNOUNCE_HOST:-$POD_NAME.$headless.$POD_NAMESPACE.svc}"
first="${FIRST_HOST:-${POD_NAME%-*}-0.$headless.$POD_NAMESPACE.svc}"
export REDISCLI_AUTH="$REDIS_PASSWORD"

primary=$(timeout 5 redis-cli --no-auth-warning -h "$sentinels" -p "$sentinel_port" \
  sentinel get-master-addr-by-name "$MASTER_SET" 2>/dev/null | head -n 1 || true)
case "$primary" in
  "" | *" "* | ERR* | NOAUTH* | WRONGPASS*) primary="" ;;
esac
if [ -z "$primary" ] && [ -f "$conf" ]; then
  primary=$(awk -v set="$MASTER_SET" '$1 == "sentinel" && $2 == "monitor" && $3 == set { print $4 }' "$conf")
fi
[ -n "$primary" ] || primary="$first"
echo "redis-init: $self starts with primary $primary"

{
  printf 'requirepass "%s"\n' "$REDIS_PASSWORD"
  printf 'masterauth "%s"\n' "$REDIS_PASSWORD"
  printf 'replica-announce-ip %s\n' "$self"
  # A primary cut off from every replica stops taking writes after 10 s, rather than take writes
  # that the failover on the other side would discard.
  printf 'min-replicas-to-write 1\nmin-replicas-max-lag 10\n'
  if [ "$primary" != "$self" ]; then
    printf 'replicaof %s %s\n' "$primary" "$port"
  fi
} > "$run/runtime.conf"

# The Sentinel's settings first (hostnames must be allowed before a `monitor` line names one),
# then what it wrote itself, less what is set here, then the password of the data nodes (after
# the `monitor` line it refers to).
fresh="$conf.new"
{
  printf 'port %s\n' "$sentinel_port"
  printf 'dir %s\n' "$(dirname "$conf")"
  printf 'sentinel resolve-hostnames yes\nsentinel announce-hostnames yes\n'
  printf 'sentinel announce-ip %s\nsentinel announce-port %s\n' "$self" "$sentinel_port"
  printf 'requirepass "%s"\n' "$REDIS_PASSWORD"
  printf 'sentinel sentinel-pass "%s"\n' "$REDIS_PASSWORD"
  if [ -f "$conf" ]; then
    # (`user default` is the password as the Sentinel rewrites it: dropped for the one above.)
    grep -v -E '^(port|dir|requirepass|user default|sentinel (resolve-hostnames|announce-hostnames|announce-ip|announce-port|sentinel-pass|auth-pass)) ' "$conf" \
      | grep -v -E '^(#|$)' || true
  else
    printf 'sentinel monitor %s %s %s %s\n' "$MASTER_SET" "$primary" "$port" "$QUORUM"
    printf 'sentinel down-after-milliseconds %s 5000\n' "$MASTER_SET"
    printf 'sentinel failover-timeout %s 60000\n' "$MASTER_SET"
    printf 'sentinel parallel-syncs %s 1\n' "$MASTER_SET"
  fi
  printf 'sentinel auth-pass %s "%s"\n' "$MASTER_SET" "$REDIS_PASSWORD"
} > "$fresh"
mv "$fresh" "$conf"
