#!/bin/sh
# The sentinel beside each Redis pod: it watches the primary as `quorum` (quorum 2 of 3),
# announces itself by its DNS name, and keeps its own state in a writable file.
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
cat > /sentinel/sentinel.conf <<CONF
port 26379
dir /sentinel
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $SELF
sentinel monitor quorum $PRIMARY 6379 2
sentinel down-after-milliseconds quorum 5000
sentinel failover-timeout quorum 60000
sentinel parallel-syncs quorum 1
CONF
exec redis-server /sentinel/sentinel.conf --sentinel
