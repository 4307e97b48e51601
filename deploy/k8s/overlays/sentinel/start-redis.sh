#!/bin/sh
# A Redis pod: a replica of the primary the sentinels name; when no sentinel answers yet
# (the first start of the group), pod 0 is the primary and the others replicate it.
set -eu
NODES=quorum-redis-nodes
SELF="$(hostname).$NODES"
PRIMARY=""
for i in 0 1 2; do
  PRIMARY=$(redis-cli -h "quorum-redis-$i.$NODES" -p 26379 --raw \
            SENTINEL get-master-addr-by-name quorum 2>/dev/null | head -n 1 || true)
  [ -n "$PRIMARY" ] && break
done
[ -n "$PRIMARY" ] || PRIMARY="quorum-redis-0.$NODES"
set -- redis-server --save "" --appendonly yes --appendfsync everysec --dir /data \
       --maxmemory 384mb --maxmemory-policy noeviction --replica-announce-ip "$SELF"
if [ "$PRIMARY" != "$SELF" ]; then
  set -- "$@" --replicaof "$PRIMARY" 6379
fi
exec "$@"
