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
# The primary is, in this order: what the running Sentinels say (the Service redis-sentinel, then
# each peer's Sentinel by its own name, ready or not), else what this pod's Sentinel last knew (a
# restart of the whole set). A first primary is elected (the first pod) only on a first install:
# every pod that has joined the set keeps a bootstrap marker on its volume ($BOOTSTRAP_MARKER), and
# a pod without one (a new volume) elects nobody while a peer answers or holds data. A pod that
# the Sentinels name as the primary but whose volume is new (its data lost) does not start as
# that primary: it waits until the Sentinels have promoted a replica, and then copies it, so an
# empty node never becomes the primary the replicas resync from.
#
# From the environment: POD_NAME, POD_NAMESPACE (downward API), REDIS_PASSWORD (the Secret; keep
# it free of quotes and backslashes, as hex is), MASTER_SET (the name clients ask the Sentinels
# for, `skein`), QUORUM (Sentinels that must agree a primary is down, 2 of 3), REPLICAS (pods of
# the StatefulSet), BOOTSTRAP_MARKER (a file on the data volume), BOOTSTRAP_WAIT (seconds a pod
# with no marker waits for a peer to answer before it takes the set for a new one, 120),
# REDIS_CLI_TLS (redis-cli's TLS options, with components/tls).
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

marker="${BOOTSTRAP_MARKER:?BOOTSTRAP_MARKER names the bootstrap marker on the data volume}"
replicas="${REPLICAS:-3}"
wait_first="${BOOTSTRAP_WAIT:-120}"
base="${POD_NAME%-*}"
# shellcheck disable=SC2086 # REDIS_CLI_TLS is a list of options
cli() { timeout 5 redis-cli --no-auth-warning ${REDIS_CLI_TLS:-} "$@" 2>/dev/null; }

# The primary the Sentinels name: the Service's, else any peer's (not ready ones included).
ask_sentinels() {
  for host in "$sentinels" $(i=0; while [ "$i" -lt "$replicas" ]; do
      echo "$base-$i.$headless.$POD_NAMESPACE.svc"; i=$((i + 1)); done); do
    [ "$host" = "$self" ] && continue
    answer=$(cli -h "$host" -p "$sentinel_port" sentinel get-master-addr-by-name "$MASTER_SET" | head -n 1 || true)
    case "$answer" in
      "" | *" "* | ERR* | NOAUTH* | WRONGPASS*) ;;
      *) echo "$answer"; return 0 ;;
    esac
  done
  return 1
}

# Whether a peer's data node answers (it then holds, or follows, the set's data).
peer_answers() {
  i=0
  while [ "$i" -lt "$replicas" ]; do
    host="$base-$i.$headless.$POD_NAMESPACE.svc"
    i=$((i + 1))
    [ "$host" = "$self" ] && continue
    cli -h "$host" -p "$port" ping | grep -q PONG && return 0
  done
  return 1
}

primary=""
waited=0
while :; do
  primary=$(ask_sentinels || true)
  if [ -z "$primary" ] && [ -f "$conf" ]; then
    primary=$(awk -v set="$MASTER_SET" '$1 == "sentinel" && $2 == "monitor" && $3 == set { print $4 }' "$conf")
  fi
  if [ -n "$primary" ] && [ "$primary" = "$self" ] && [ ! -f "$marker" ] && [ ! -f "$conf" ]; then
    # Named the primary with a new, empty volume (no marker, and no Sentinel configuration of
    # an earlier version of this script either): starting would hand the replicas an empty
    # data set. Wait for the Sentinels to promote one of them (this node is down to them).
    echo "redis-init: $self is the primary the set knows, but its volume is new: waiting for a failover"
    primary=""
  elif [ -n "$primary" ]; then
    break
  elif [ -f "$marker" ] || [ -f "$conf" ]; then
    # This pod was part of the set: never elect, wait for the peers.
    echo "redis-init: $self waits for its peers' Sentinels"
  elif [ "$POD_NAME" = "$base-0" ] && [ "$waited" -ge "$wait_first" ] && ! peer_answers; then
    # Nobody has answered for BOOTSTRAP_WAIT seconds, no peer holds data, and this volume never
    # held the set's data: a first install.
    primary="$first"
    echo "redis-init: no peer answered in ${waited}s and no volume was bootstrapped: a first install"
    break
  fi
  sleep 5
  waited=$((waited + 5))
done
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
  if [ -n "${REDIS_TLS_DIR:-}" ]; then
    # TLS only (components/tls): clients, replication and the Sentinels' checks alike.
    printf 'port 0\ntls-port %s\ntls-replication yes\ntls-auth-clients no\n' "$port"
    printf 'tls-cert-file %s/tls.crt\ntls-key-file %s/tls.key\ntls-ca-cert-file %s/ca.crt\n' \
      "$REDIS_TLS_DIR" "$REDIS_TLS_DIR" "$REDIS_TLS_DIR"
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
  if [ -n "${REDIS_TLS_DIR:-}" ]; then
    printf 'port 0\ntls-port %s\ntls-replication yes\ntls-auth-clients no\n' "$sentinel_port"
    printf 'tls-cert-file %s/tls.crt\ntls-key-file %s/tls.key\ntls-ca-cert-file %s/ca.crt\n' \
      "$REDIS_TLS_DIR" "$REDIS_TLS_DIR" "$REDIS_TLS_DIR"
  fi
  if [ -f "$conf" ]; then
    # (`user default` is the password as the Sentinel rewrites it: dropped for the one above.)
    grep -v -E '^(port|tls-[a-z-]+|dir|requirepass|user default|sentinel (resolve-hostnames|announce-hostnames|announce-ip|announce-port|sentinel-pass|auth-pass)) ' "$conf" \
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
# This volume now belongs to a set that has a primary: from here on, this pod never elects one.
date -u +%Y-%m-%dT%H:%M:%SZ > "$marker"
